"""Lightning only: the LightningModule (loss, optimizer, schedule, compile), the step timer, checkpoints, loggers and
the DDP/FSDP strategies. The model itself is plain PyTorch in model/; train.py puts these together."""
