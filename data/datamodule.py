"""LightningDataModule: corpus -> deterministic document split -> BPE tokenizer -> packed token blocks.

prepare_data (one process per node) does the work and fills the caches: the datasets cache
(tokenization and packing through Dataset.map, batched) and the tokenizer file. setup (every
process) repeats the same calls, which then only read those caches.

Each training row is seq_len + 1 tokens: inputs are the first seq_len, targets the last seq_len. A row packs
several documents, each ended by EOS; with document_boundaries each batch also carries `seq_idx`, the document of
every input token, and the model keeps each document's state and conv window to itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import datasets
import lightning as L
import torch
from torch.utils.data import DataLoader, DistributedSampler

from data.corpus import load_corpus, local_files
from data.tokenizer import EOS, PackedBatch, encode_batch, file_digest, load_tokenizer, pack_batch, train_tokenizer

log = logging.getLogger(__name__)


class ResumableSampler(DistributedSampler):
    """Shuffled epochs, one permutation per epoch from (seed, epoch), that a resumed run continues exactly.

    Where to start is read when iteration starts, from `consumed()` (samples this rank has already
    trained on, from the restored global step), so a resumed run sees the same batches in the same
    order as an uninterrupted one. Each epoch yields a whole number of batches per rank.
    """

    def __init__(self, dataset, num_replicas: int, rank: int, seed: int, batch_size: int, consumed=lambda: 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.batch_size = batch_size
        self.consumed = consumed
        self.per_epoch = (self.num_samples // batch_size) * batch_size
        if self.per_epoch == 0:
            raise ValueError(
                f"the training split has {len(dataset)} blocks, fewer than one batch of {batch_size} per each of "
                f"{num_replicas} processes; lower data.batch_size or data.seq_len, or use a larger corpus"
            )

    def __iter__(self):
        epoch, offset = divmod(self.consumed(), self.per_epoch)
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        order = torch.randperm(len(self.dataset), generator=g)[: self.total_size]
        mine = order[self.rank : self.total_size : self.num_replicas][: self.per_epoch]
        return iter(mine[offset:].tolist())

    def __len__(self) -> int:
        return self.per_epoch


class ResumableLoader(DataLoader):
    """A DataLoader that tells Lightning it resumes mid-epoch: its ResumableSampler continues from the
    restored global step, so the saved state only records where that was."""

    def state_dict(self) -> dict:
        return {"consumed_samples": self.sampler.consumed()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Nothing to restore: the sampler reads the restored global step when iteration starts."""


class TextDataModule(L.LightningDataModule):
    def __init__(
        self,
        corpus: str = "stdlib",
        text_field: str = "text",
        sample_by: str = "document",
        max_documents: int | None = None,
        val_fraction: float = 0.05,
        vocab_size: int = 4096,
        seq_len: int = 256,
        batch_size: int = 16,
        num_workers: int = 0,
        cache_dir: str = ".cache/data",
        seed: int = 1234,
        document_boundaries: bool = True,
    ):
        """
        Args:
            corpus: "stdlib" (the default, needs nothing), a local file/directory/glob (checked here: it must exist
                and hold files the corpus reads), or "hub:owner/name[:config]".
            text_field: the text column of jsonl/parquet/hub data.
            sample_by: one row of a text file is a "document", "paragraph" or "line".
            max_documents: keep this many documents (a seeded random subset) to shorten a run.
            val_fraction: share of documents held out for validation (at least one).
            vocab_size: BPE vocabulary size, EOS included; the model's vocab_size follows it.
            seq_len: tokens per training sequence.
            batch_size: sequences per batch per process.
            cache_dir: datasets cache and tokenizer files.
            document_boundaries: give each batch the document ids of its tokens (`seq_idx`), so that no document
                reads the end of the one packed before it; false lets state flow across documents.
        """
        super().__init__()
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
        if sample_by not in ("document", "paragraph", "line"):
            raise ValueError(f"data.sample_by must be document, paragraph or line, got {sample_by!r}")
        for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len), ("batch_size", batch_size)):
            if value < 1:
                raise ValueError(f"data.{name} must be positive, got {value}")
        if vocab_size < 257:
            raise ValueError(f"data.vocab_size must be at least 257 (256 bytes + EOS), got {vocab_size}")
        if corpus != "stdlib" and not corpus.startswith("hub:"):
            local_files(corpus)  # a missing path or a file the corpus cannot read: refused before any run begins
        self.save_hyperparameters()
        self.corpus, self.text_field, self.sample_by = corpus, text_field, sample_by
        self.max_documents, self.val_fraction, self.seed = max_documents, val_fraction, seed
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.num_workers = num_workers
        self.document_boundaries = document_boundaries
        self.cache_dir = Path(cache_dir)
        self.tokenizer_path: Path | None = None
        self.train_set = self.val_set = None

    # -- the pipeline --------------------------------------------------------------------------
    def _splits(self) -> datasets.DatasetDict:
        ds = load_corpus(self.corpus, self.text_field, self.sample_by, cache_dir=str(self.cache_dir / "hf"))
        if len(ds) < 2:
            raise ValueError(
                f"corpus {self.corpus!r} has {len(ds)} document; a train/val split needs two or more "
                "(for a single text file set data.sample_by: paragraph or line)"
            )
        if self.max_documents is not None and self.max_documents < len(ds):
            ds = ds.shuffle(seed=self.seed).select(range(max(2, self.max_documents)))
        n_val = max(1, round(self.val_fraction * len(ds)))
        return ds.train_test_split(test_size=n_val, seed=self.seed, shuffle=True)

    def _tokenizer(self, train: datasets.Dataset) -> Path:
        key = hashlib.sha256(f"{train._fingerprint}|{self.vocab_size}".encode()).hexdigest()[:16]
        path = self.cache_dir / "tokenizers" / f"bpe-{key}.json"
        if not path.exists():
            log.info("training a %d-token byte-level BPE on %d documents -> %s", self.vocab_size, len(train), path)
            batches = (train[i : i + 1000]["text"] for i in range(0, len(train), 1000))
            train_tokenizer((t for batch in batches for t in batch), self.vocab_size, path)
        return path

    def _blocks(self, split: datasets.Dataset, name: str, tokenizer: Path, digest: str) -> datasets.Dataset:
        encoded = split.map(
            encode_batch,
            batched=True,
            remove_columns=["text"],
            fn_kwargs={"tokenizer_path": str(tokenizer), "tokenizer_digest": digest},
            features=datasets.Features({"ids": datasets.Sequence(datasets.Value("int32"))}),
            desc=f"tokenizing {name}",
        )
        blocks = encoded.map(
            pack_batch,
            batched=True,
            batch_size=1000,
            remove_columns=["ids"],
            fn_kwargs={"block": self.seq_len + 1},
            features=datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))}),
            desc=f"packing {name} into {self.seq_len + 1}-token blocks",
        )
        if len(blocks) == 0:
            raise ValueError(
                f"the {name} split of {self.corpus!r} holds fewer than seq_len + 1 = {self.seq_len + 1} tokens; "
                "lower data.seq_len, raise data.val_fraction, or use a larger corpus"
            )
        return blocks.with_format("torch")

    def _build(self) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
        splits = self._splits()
        self.tokenizer_path = self._tokenizer(splits["train"])
        digest = file_digest(self.tokenizer_path)
        self.train_set = self._blocks(splits["train"], "train", self.tokenizer_path, digest)
        self.val_set = self._blocks(splits["test"], "val", self.tokenizer_path, digest)

    def prepare_data(self) -> None:
        self._build()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self._build()
        # Worker processes fork after this point: keep the Rust tokenizer's thread pool out of them.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        log.info("data: %d train and %d val blocks of %d tokens", len(self.train_set), len(self.val_set), self.seq_len)

    # -- loaders -------------------------------------------------------------------------------
    def _consumed(self) -> int:
        trainer = self.trainer
        if trainer is None:
            return 0
        return trainer.global_step * trainer.accumulate_grad_batches * self.batch_size

    def _collate(self) -> PackedBatch:
        """Batches of blocks, with their document ids when document_boundaries (EOS's id from the tokenizer)."""
        if not self.document_boundaries:
            return PackedBatch(None)
        tokenizer = load_tokenizer(str(self.tokenizer_path), file_digest(self.tokenizer_path))
        return PackedBatch(tokenizer.token_to_id(EOS))

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        world = trainer.world_size if trainer is not None else 1
        rank = trainer.global_rank if trainer is not None else 0
        sampler = ResumableSampler(self.train_set, world, rank, self.seed, self.batch_size, self._consumed)
        return ResumableLoader(
            self.train_set,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=True,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            persistent_workers=self.num_workers > 0,
            collate_fn=self._collate(),
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_set,
            batch_size=self.batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            pin_memory=torch.cuda.is_available(),
            collate_fn=self._collate(),
        )

    # -- checkpoints carry the tokenizer, so a checkpoint alone is enough to generate -------------
    def state_dict(self) -> dict:
        if self.tokenizer_path is None:
            return {}
        return {"tokenizer_json": self.tokenizer_path.read_text()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Refuse a checkpoint whose tokenizer is not the one these data settings build: its token ids would
        mean other text."""
        saved = state_dict.get("tokenizer_json")
        if (
            saved
            and self.tokenizer_path is not None
            and json.loads(saved) != json.loads(self.tokenizer_path.read_text())
        ):
            raise ValueError(
                "the checkpoint was trained with another tokenizer than the one data.* builds here (corpus, "
                "max_documents, val_fraction, seed and vocab_size decide it); resume with the data settings that "
                "wrote it, or drop --ckpt_path to start a fresh run"
            )
