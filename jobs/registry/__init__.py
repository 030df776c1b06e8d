"""Schemas in a schema registry that speaks Confluent's REST API (Confluent's own, Karapace,
Apicurio's ccompat API): the `schema-registry` kind of connection (connection.py), a client of
the API (client.py), which subject a topic's values are registered under (subjects.py),
Confluent's wire format (a zero byte, the schema's id in 4 bytes, the Avro body), Avro's
resolution rules in words (compatibility.py) and the Avro schema Spark writes a Spark type with
(spark_avro.py, a port of Spark's SchemaConverters.toAvroType). Spark-free
and Django-free; records are decoded in the executors' JVM (controlplane.spark.ConfluentAvro).
"""

# How long executors wait for a registry that does not answer, asked for a writer schema they
# have not seen yet (ids seen decode on), before the batch fails (a connection's wait_seconds,
# by default).
DEFAULT_WAIT_SECONDS = 60.0
