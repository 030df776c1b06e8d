"""The files sink's writer (the foreachBatch function of a files sink): the records that
parsed, through the transform if any, are staged in one pass while those that did not are
counted; a batch that had some reads them again for its dead letters; then the batch's
marker. A thread of the driver rolls staged rows into finished files (jobs.sinks.files.store)."""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

from ...batch import Batch, count_all, query_active, stream_id
from ...runconfig import RunConfig
from . import store as files
from .kind import KIND
from .model import FilesSink

log = logging.getLogger("jobs.pipeline")


@dataclass
class Plan:
    """Learnt from the first batch: the output's schema, as the key its staged files are
    grouped by for rolling (files of one schema are merged together)."""

    schema: str


class Writer:
    """The foreachBatch function of a files sink."""

    def __init__(self, config: RunConfig, partitions: int = 2, index: int = 0):
        self.batch = Batch(config, index, KIND)
        self.config = config
        self.sink: FilesSink = self.batch.sink
        self.store: files.FilesStore | None = None  # the sink's directory, once opened
        self.compactor: files.Compactor | None = None
        self.plan: Plan | None = None

    def open(self, spark, query_id: str) -> None:
        """The sink's directory and its rolling thread (which first finishes what a killed
        driver left): started with the query, so rolling goes on while no batch comes."""
        if self.store is not None:
            return
        root = self.batch.client()["root"]
        self.store = files.FilesStore(
            spark, files.base_uri(root, self.sink.path), self.sink, query_id
        )
        alive = functools.partial(query_active, self.batch.session or spark, query_id)
        self.compactor = files.Compactor(self.store, alive, self.config.pipeline).start()

    def __call__(self, parsed, batch_id: int) -> None:
        from pyspark.sql import Observation

        if self.store is None:
            self.open(parsed.sparkSession, stream_id(self.config.checkpoint, self.config.store))
        self.compactor.check()
        if self.store.committed(batch_id):
            self.batch.skip(parsed, batch_id, "staged")
            return
        columns, count, good, named = self.batch.observed_parts()
        observation = Observation(f"cp_unparsed_{batch_id}")
        out = parsed.select(*columns).observe(observation, count).where(good).select(*named)
        transform = self.batch.transform
        if transform is not None:
            out.createOrReplaceTempView("source")
            out = parsed.sparkSession.sql(transform.sql)
        if self.plan is None:
            files.check_columns(self.sink, out.columns)
            self.plan = Plan(files.group_key(self.sink, out.schema.json()))
        started = time.monotonic()
        self.store.stage(out, batch_id)
        staged = time.monotonic()
        unparsed = files.observed(observation)
        if unparsed != 0:  # None (not reported): read them to be safe
            letters = self.batch.dead_letters(parsed.select(*self.batch.one_pass_columns()))
            counted = Observation(f"cp_dead_{batch_id}")
            self.store.write_dead_letters(letters.observe(counted, count_all()), batch_id)
            unparsed = files.observed(counted)
        self.store.commit(batch_id, schema=self.plan.schema, dead_letters=unparsed)
        self.compactor.poke()
        log.info(
            "batch %s: staged (files) in %.2f s, committed in %.2f s, %s dead letters",
            batch_id,
            staged - started,
            time.monotonic() - staged,
            unparsed,
        )
