"""What a driver's JVM loads when it starts a pipeline, done once for its class-data archive
(jobs.jvm.build_class_archive): `spark-submit jobs/jvm_warmup.py DIR [--session-only]`. A
session as every driver of ours has it, a batch query with JSON parsing and SQL, and a
streaming query with a checkpoint, `foreachBatch` and a stateful aggregation over Spark's
rate source, then a clean exit, at which the JVM writes the classes it loaded into the
archive (-XX:ArchiveClassesAtExit). `--session-only`: a session started and stopped (the
archive's check). Reads and writes nothing outside DIR."""

from __future__ import annotations

import sys
from pathlib import Path


def main(directory: str) -> int:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = SparkSession.builder.getOrCreate()
    if "--session-only" in sys.argv:  # the archive's check: a driver starts from it
        spark.stop()
        return 0
    try:
        rows = spark.createDataFrame([('{"id": "a", "n": 1}',), ('{"id": "b", "n": 2}',)], ["v"])
        parsed = rows.select(F.from_json("v", "id STRING, n INT").alias("r")).select("r.*")
        parsed.createOrReplaceTempView("source")
        spark.sql("SELECT id, sum(n) AS n FROM source GROUP BY id").collect()
        stream = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 100)
            .load()
            .withWatermark("timestamp", "1 second")
            .groupBy(F.window("timestamp", "1 second"))
            .count()
        )
        query = (
            stream.writeStream.outputMode("append")
            .option("checkpointLocation", str(Path(directory) / "checkpoint"))
            .foreachBatch(lambda frame, batch_id: frame.count())
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print("usage: spark-submit jobs/jvm_warmup.py DIR [--session-only]", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
