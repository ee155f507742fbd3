"""Lightning's DDP and FSDP strategies with two corrections, registered under Lightning's own names, so that
`--trainer.strategy ddp` and `--trainer.strategy fsdp` (and `auto` on several GPUs) use them.

DDPStrategy   wraps the model on the current CUDA stream. Lightning 2.6 builds DistributedDataParallel on a new
              side stream; DDP's reducer then keeps AccumulateGrad nodes bound to that stream while forward and
              backward run on the current one, and every backward warns "The AccumulateGrad node's stream does
              not match the stream of the node that produced the incoming gradient" and adds a cross-stream wait
              per gradient (Lightning issue #21567, fixed upstream by the same change).
FSDPStrategy  under bf16-mixed (with no explicit `mixed_precision`), keeps parameters, their all-gather and the
              gradient reduction in float32 and computes in bf16 through autocast, as DDP's bf16-mixed does.
              Lightning 2.6 casts FSDP's parameters to bf16 for compute and reduces gradients in bf16: A_log,
              dt_bias and D would enter the SSD rounded to 8 bits of mantissa, and runs would not match DDP's.

Gradient clipping and the weight-decay groups under FSDP are LanguageModel's (language_model.py).
"""

from __future__ import annotations

import torch
from lightning.pytorch.strategies import DDPStrategy as _LightningDDP
from lightning.pytorch.strategies import FSDPStrategy as _LightningFSDP
from lightning.pytorch.strategies import StrategyRegistry
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel

STREAM_WARNING = "AccumulateGrad node's stream does not match"  # what the side-stream DDP warns, in part


class DDPStrategy(_LightningDDP):
    """Lightning's DDPStrategy, with DistributedDataParallel built on the stream that runs the steps."""

    def _setup_model(self, model: Module) -> DistributedDataParallel:
        return DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)


class FSDPStrategy(_LightningFSDP):
    """Lightning's FSDPStrategy; bf16-mixed keeps float32 parameters and gradient reduction (autocast computes in bf16)."""

    @property
    def mixed_precision_config(self):
        if self.mixed_precision is None and self.precision_plugin.precision == "bf16-mixed":
            from torch.distributed.fsdp import MixedPrecision

            return MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.float32, buffer_dtype=torch.float32)
        return super().mixed_precision_config


def register() -> None:
    """Make Lightning's strategy names "ddp" and "fsdp" build the classes above (idempotent)."""
    StrategyRegistry.register("ddp", DDPStrategy, description="DDP on the current stream", override=True)
    if torch.distributed.is_available():
        StrategyRegistry.register("fsdp", FSDPStrategy, description="FSDP, float32 parameters", override=True)


register()
