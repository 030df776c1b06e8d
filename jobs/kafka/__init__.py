"""Reading Kafka from Spark without the JVM connector: a Python Data Source and its maths."""
