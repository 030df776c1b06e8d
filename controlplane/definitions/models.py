"""Pipeline definitions: desired state lives here, and every spec ever accepted is kept."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from controlplane.connections.models import NAME_VALIDATOR, Connection


class DesiredState(models.TextChoices):
    RUNNING = "running", "Running"
    STOPPED = "stopped", "Stopped"
    SUSPENDED = "suspended", "Suspended"


class Status(models.TextChoices):
    """What the control plane observes (set by the reconciler, never by an API client)."""

    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    RESTARTING = "restarting", "Restarting"
    BACKING_OFF = "backing-off", "Backing off"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"
    SUSPENDED = "suspended", "Suspended"
    FAILED = "failed", "Failed"

    @classmethod
    def terminal(cls) -> set[str]:
        """States in which no driver process exists or is being started."""
        return {cls.STOPPED, cls.SUSPENDED, cls.FAILED}


class ApplicationStatus(models.TextChoices):
    """What the control plane observes of a shared Spark application."""

    STARTING = "starting", "Starting"  # launched; its Spark session is not up yet
    RUNNING = "running", "Running"  # takes pipelines
    RECYCLING = "recycling", "Recycling"  # members stopping, then the process is killed
    RESTARTING = "restarting", "Restarting"  # lost; started again at next_attempt_at
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"


class SparkApplication(models.Model):
    """A long-lived Spark application (one driver process) that hosts many pipelines' queries,
    each with its own checkpoint, scheduler pool, run token and generation. Defined by an
    operator; started, observed and stopped by the reconciler like a run."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    description = models.TextField(blank=True)
    master = models.CharField(
        max_length=255, blank=True, help_text="Spark master URL; empty: the control plane's."
    )
    driver_memory = models.CharField(max_length=16, default="2g")
    executor_memory = models.CharField(max_length=16, blank=True)
    conf = models.JSONField(default=dict, blank=True, help_text="Allow-listed Spark settings.")
    capacity = models.PositiveIntegerField(default=25, help_text="At most this many pipelines.")
    desired_state = models.CharField(
        max_length=16, choices=DesiredState.choices[:2], default=DesiredState.RUNNING
    )
    status = models.CharField(
        max_length=16, choices=ApplicationStatus.choices, default=ApplicationStatus.STOPPED
    )
    status_message = models.TextField(blank=True, default="")
    # Increases with every launch of its process; a member run names the generation it was
    # placed in.
    generation = models.PositiveIntegerField(default=0)
    host = models.CharField(max_length=255, blank=True)
    pid = models.IntegerField(null=True, blank=True, help_text="The supervisor's process id.")
    process_started = models.FloatField(null=True, blank=True)
    app_dir = models.CharField(max_length=1024, blank=True)
    token_digest = models.CharField(max_length=64, blank=True, db_index=True, editable=False)
    started_at = models.DateTimeField(null=True, blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # A member's query would not stop: the others stop gracefully, then the process is killed.
    recycle_requested_at = models.DateTimeField(null=True, blank=True)
    recycle_reason = models.TextField(blank=True)
    # Losses in a row (reset once it has run for a while); the next launch waits until then.
    attempt = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0, help_text="Launches after a loss, ever.")
    last_exit_code = models.IntegerField(null=True, blank=True)
    last_exit_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    # Measured by the control plane on its host (the process tree of its supervisor).
    rss_bytes = models.BigIntegerField(null=True, blank=True)
    cpu_seconds = models.FloatField(null=True, blank=True)
    cpu_percent = models.FloatField(null=True, blank=True)
    measured_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


DEDICATED = "dedicated"
AUTO = "auto"


class Pipeline(models.Model):
    """A streaming pipeline: its current spec (canonical JSON), version and desired state."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    description = models.TextField(blank=True)
    spec = models.JSONField(help_text="Current spec, canonical form (all defaults spelled out).")
    version = models.PositiveIntegerField(default=1)
    desired_state = models.CharField(
        max_length=16, choices=DesiredState.choices, default=DesiredState.STOPPED
    )
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.STOPPED)
    # Increases with every launch; the current run carries it (fencing token).
    generation = models.PositiveIntegerField(default=0)
    # Supervision: failures since `restarts_since` (the last start by hand, or reset) are what
    # the restart policy counts; a restart it decided on waits for `next_attempt_at`.
    restarts_since = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0, help_text="Restart attempt under the policy.")
    restarts = models.PositiveIntegerField(default=0, help_text="Automatic restarts, ever.")
    # Why the control plane cannot act on the pipeline right now (e.g. its run is on another
    # host); empty when it can.
    status_message = models.TextField(blank=True, default="")
    # Where its query runs: its own Spark application ("dedicated"), a shared one by name, or
    # any shared one with room ("auto").
    placement = models.CharField(max_length=63, default=DEDICATED)
    # Labels (team, domain, ...): {"team": "payments"}. The overview filters by them, bulk
    # actions and alert rules select pipelines by them.
    labels = models.JSONField(default=dict, blank=True)
    # Offsets an operator reset it to ({topic: {partition: offset}}): where its next run
    # starts, in a new checkpoint; cleared once that checkpoint holds them.
    offsets_reset = models.JSONField(null=True, blank=True, editable=False)
    # Take a restore point this often while it runs (None: only on demand and before
    # changes).
    restore_point_minutes = models.PositiveIntegerField(
        null=True, blank=True, help_text="Take a restore point this often while it runs."
    )
    # Roll a new spec version back automatically when it is a bad deploy (no batch within
    # this many minutes of its start although records wait, or failing repeatedly): None:
    # never (supervision.auto_rollback); when it last happened, and what.
    auto_rollback_minutes = models.PositiveIntegerField(null=True, blank=True)
    auto_rolled_back_at = models.DateTimeField(null=True, blank=True, editable=False)
    auto_rollback_note = models.TextField(blank=True, default="", editable=False)
    # The control-plane host its next dedicated driver was sent to (and when): counted as
    # that host's until the run exists there, or the placement is older than a minute.
    placed_host = models.CharField(max_length=255, blank=True, editable=False)
    placed_at = models.DateTimeField(null=True, blank=True, editable=False)
    connections = models.ManyToManyField(
        Connection, through="PipelineConnection", related_name="pipelines", blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["desired_state", "status"])]

    def __str__(self) -> str:
        return self.name

    @property
    def trigger_seconds(self) -> float:
        """The spec's micro-batch interval (the spec is canonical: the default is spelled out)."""
        return float(self.spec.get("trigger", {}).get("interval_seconds", 1.0))


class PipelineVersion(models.Model):
    """An accepted spec, kept forever: what ran when, and what to roll back to."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    spec = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Where it came from when a fleet's files made it (controlplane.fleet): {"fleet",
    # "repository", "commit", "path", "document"}; empty: the API, a form or the admin.
    source = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["pipeline", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "version"], name="one_row_per_version")
        ]

    def __str__(self) -> str:
        return f"{self.pipeline.name} v{self.version}"


class ManagedObject(models.Model):
    """An object kept in a fleet's files (definitions as code, controlplane.fleet): which
    fleet manages it, what its files said when it was last applied, and what the apply left
    it as, so that a change made elsewhere (a form, the API, the admin) shows as drift.
    `kind` is the document's (Connection, Pipeline, SparkApplication, AlertRule,
    AlertChannel); the row outlives its object (a deletion elsewhere is drift too)."""

    kind = models.CharField(max_length=32)
    name = models.CharField(max_length=63)
    fleet = models.CharField(max_length=63, db_index=True)
    # sha256 of the document as the files gave it (templates expanded, environment applied,
    # secret references' values included): the same input again is unchanged at once.
    input_digest = models.CharField(max_length=64)
    # The object as the apply left it: its document (as export writes it), and the sha256
    # of that and its secrets' values.
    document = models.JSONField(default=dict)
    digest = models.CharField(max_length=64)
    # Where the files keep its secrets: {path: {"env": NAME} | {"file": NAME}}.
    secret_refs = models.JSONField(default=dict, blank=True)
    source = models.JSONField(default=dict, blank=True)  # repository, commit, path, document
    applied_at = models.DateTimeField()
    applied_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # First seen differing from `digest` (None: as applied), and how (what differs).
    drifted_at = models.DateTimeField(null=True, blank=True)
    drift = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["kind", "name"], name="managed_once_per_object")
        ]

    def __str__(self) -> str:
        return f"{self.kind}/{self.name} (fleet {self.fleet})"


class PipelineConnection(models.Model):
    """Which connections a pipeline's current spec uses; PROTECT keeps them from vanishing."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE)
    connection = models.ForeignKey(Connection, on_delete=models.PROTECT)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "connection"], name="one_row_per_use")
        ]

    def __str__(self) -> str:
        return f"{self.pipeline_id} uses {self.connection_id}"


class ReconcilerState(models.Model):
    """One row: when the reconcile tick last ran, so operators can see the scheduler is alive."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    last_tick_at = models.DateTimeField(null=True)
    # When ticks started again after a gap (the control plane's database or its workers were
    # down): drivers could not be heard meanwhile, so their silence is measured from here.
    resumed_at = models.DateTimeField(null=True)
    ticks = models.PositiveBigIntegerField(default=0)
    last_summary = models.JSONField(default=dict)

    def __str__(self) -> str:
        return f"reconciler (last tick {self.last_tick_at})"


class Host(models.Model):
    """A control-plane host: a machine whose Celery worker launches, observes, stops and
    kills the driver processes placed on it (runs and applications name it in `host`). Its
    worker says it is alive every few seconds; one silent for CONTROLPLANE_HOST_TIMEOUT is
    lost, and what ran there is started elsewhere."""

    name = models.CharField(max_length=255, unique=True)
    capacity = models.PositiveIntegerField(
        default=1, help_text="How many driver processes (dedicated drivers, applications)."
    )
    first_seen_at = models.DateTimeField(auto_now_add=True)
    seen_at = models.DateTimeField(help_text="When its worker last said it is alive.")
    # When its runs were declared lost (it had gone silent); cleared when it is heard again.
    lost_at = models.DateTimeField(null=True, blank=True)
    memory_bytes = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class RunState(models.TextChoices):
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    STOPPING = "stopping", "Stopping"
    EXITED = "exited", "Exited"

    @classmethod
    def active(cls) -> list[str]:
        return [cls.STARTING, cls.RUNNING, cls.STOPPING]


class Run(models.Model):
    """One launch of a pipeline's driver. `generation` fences it: a report from any run but
    the pipeline's current one is stale and refused."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="runs")
    generation = models.PositiveIntegerField()
    spec_version = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.STARTING)
    host = models.CharField(max_length=255, blank=True)
    pid = models.IntegerField(null=True, blank=True, help_text="The supervisor's process id.")
    # With the pid, the supervisor's identity: a pid reused after a reboot is not our process.
    process_started = models.FloatField(
        null=True, blank=True, help_text="The supervisor's start time (Unix time, psutil)."
    )
    run_dir = models.CharField(max_length=1024, blank=True)
    log_path = models.CharField(max_length=1024, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    cause = models.CharField(max_length=64, blank=True)
    error_tail = models.TextField(blank=True)
    # The driver authenticates its reports with a token of its own (only its digest is kept).
    token_digest = models.CharField(max_length=64, blank=True, db_index=True, editable=False)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_batch_id = models.BigIntegerField(null=True, blank=True)
    last_batch_at = models.DateTimeField(null=True, blank=True)
    # The query said it waits for data (no batch because there is nothing to read).
    last_idle_at = models.DateTimeField(null=True, blank=True)
    # A run in a shared application: its query runs in that application's process (whose
    # supervisor `pid` then names), placed in its `application_generation`.
    application = models.ForeignKey(
        SparkApplication, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    application_generation = models.PositiveIntegerField(null=True, blank=True)
    # A query is killed by asking its application (it cannot be killed alone by signal):
    # the run ends when the application says the query has ended, with this cause.
    kill_requested_at = models.DateTimeField(null=True, blank=True)
    end_cause = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # Never two drivers for one pipeline: the database refuses a second active run.
            models.UniqueConstraint(
                fields=["pipeline"],
                condition=models.Q(state__in=["starting", "running", "stopping"]),
                name="one_active_run_per_pipeline",
            ),
            models.UniqueConstraint(
                fields=["pipeline", "generation"], name="one_run_per_generation"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pipeline.name} run {self.generation}"


class Failure(models.Model):
    """A run that ended without being asked to (the pipeline's exceptions history), and what
    the restart policy decided about it. Kept across restarts."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="failures")
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="failures"
    )
    at = models.DateTimeField()
    cause = models.CharField(max_length=64)
    message = models.TextField(blank=True, help_text="The end of the driver's error output.")
    reason = models.TextField(
        blank=True, help_text="Why, in one line naming what to fix (supervision.explain)."
    )
    category = models.CharField(
        max_length=40, blank=True, help_text="The kind of failure (explain.CATALOGUE's key)."
    )
    permanent = models.BooleanField(default=False)
    run_started_at = models.DateTimeField(null=True, blank=True)
    decision = models.TextField(blank=True, help_text="What the restart policy decided, and why.")
    restart_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["pipeline", "at"])]

    def __str__(self) -> str:
        return f"{self.pipeline.name} {self.cause} at {self.at}"


class RestorePointKind(models.TextChoices):
    MANUAL = "manual"
    SCHEDULED = "scheduled"
    BEFORE_CHANGE = "before-change"  # a new spec version's first run on an existing checkpoint
    BEFORE_RESTORE = "before-restore"  # the checkpoint a restore replaced
    BEFORE_OFFSETS_RESET = "before-offsets-reset"  # the checkpoint an offsets reset set aside
    BEFORE_DELETE = "before-delete"  # the checkpoint of a pipeline deleted since


class RestorePoint(models.Model):
    """A consistent copy of a pipeline's checkpoint as of one committed batch (the Flink
    operator's savepoint history, for Spark): what the pipeline can be restored to. Kept by
    pipeline name, so the last one outlives the pipeline's deletion."""

    pipeline = models.ForeignKey(
        Pipeline, null=True, blank=True, on_delete=models.SET_NULL, related_name="restore_points"
    )
    pipeline_name = models.CharField(max_length=63, db_index=True)
    kind = models.CharField(max_length=32, choices=RestorePointKind.choices)
    created_at = models.DateTimeField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField(blank=True)
    path = models.CharField(max_length=1024)
    spec_version = models.PositiveIntegerField(
        null=True, blank=True, help_text="The spec version whose run wrote the checkpoint."
    )
    query_id = models.CharField(max_length=64, blank=True)
    last_batch_id = models.BigIntegerField(null=True, blank=True)
    committed_at = models.DateTimeField(null=True, blank=True)
    offsets = models.JSONField(default=dict, help_text="{topic: {partition: next offset}}")
    size_bytes = models.BigIntegerField(default=0)
    files = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["pipeline_name", "created_at"])]

    def __str__(self) -> str:
        return f"{self.pipeline_name} restore point {self.pk} ({self.kind})"


class BatchProgress(models.Model):
    """One micro-batch as the driver reported it (StreamingQueryProgress, the useful part)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="batches")
    batch_id = models.BigIntegerField()
    reported_at = models.DateTimeField(auto_now_add=True)
    timestamp = models.DateTimeField(help_text="When the batch started, by the driver's clock.")
    num_input_rows = models.BigIntegerField(default=0)
    input_rows_per_second = models.FloatField(null=True)
    processed_rows_per_second = models.FloatField(null=True)
    batch_duration_ms = models.BigIntegerField(null=True)
    durations_ms = models.JSONField(default=dict)
    end_offsets = models.JSONField(null=True)
    latest_offsets = models.JSONField(null=True)
    state_rows = models.BigIntegerField(
        null=True, help_text="Rows held by stateful operators (sum over them); null: none."
    )
    state_memory_bytes = models.BigIntegerField(null=True)
    watermark = models.DateTimeField(null=True, help_text="The event-time watermark, if any.")

    class Meta:
        ordering = ["-run", "-batch_id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "batch_id"], name="one_progress_per_batch")
        ]

    def __str__(self) -> str:
        return f"{self.run} batch {self.batch_id}"


class AuditEntry(models.Model):
    """One change by a person: an action on a pipeline (who, what, when, why, and the state
    before and after), or a change to a connection (`connection_name` set, `pipeline_name`
    empty; before/after hold its non-secret settings and the names of its secrets, never
    their values). Written in the same transaction as the change it records."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, help_text="Kept if the user is deleted.")
    action = models.CharField(max_length=32)
    pipeline = models.ForeignKey(
        Pipeline, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit"
    )
    pipeline_name = models.CharField(max_length=63, db_index=True, blank=True, default="")
    connection_name = models.CharField(max_length=63, db_index=True, blank=True, default="")
    application_name = models.CharField(max_length=63, db_index=True, blank=True, default="")
    reason = models.TextField(blank=True)
    before = models.JSONField(default=dict)
    after = models.JSONField(default=dict)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        subject = self.pipeline_name or (
            f"application {self.application_name}"
            if self.application_name
            else f"connection {self.connection_name}"
        )
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name} {self.action} {subject}"


class ProgressRollup(models.Model):
    """Batch progress older than the raw retention, summed per pipeline and hour, so that
    months of history for hundreds of pipelines stay small. Sums and counts (not means), so
    that rolling up a bucket in several passes gives the same figures."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="rollups")
    bucket_start = models.DateTimeField()
    bucket_seconds = models.PositiveIntegerField(default=3600)
    batches = models.PositiveBigIntegerField(default=0)
    input_rows = models.PositiveBigIntegerField(default=0)
    sum_input_rows_per_second = models.FloatField(default=0.0)
    sum_processed_rows_per_second = models.FloatField(default=0.0)
    sum_batch_duration_ms = models.FloatField(default=0.0)
    max_batch_duration_ms = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["pipeline", "bucket_start"]
        constraints = [
            models.UniqueConstraint(
                fields=["pipeline", "bucket_start", "bucket_seconds"], name="one_rollup_per_bucket"
            )
        ]

    def __str__(self) -> str:
        return f"{self.pipeline.name} {self.bucket_start:%Y-%m-%d %H:%M}"


class LagSample(models.Model):
    """A pipeline's Kafka lag as the metrics collector measured it, every
    CONTROLPLANE_COLLECT_SECONDS, whether its job runs or not (a stopped job's lag grows on
    the chart). Kept CONTROLPLANE_LAG_SAMPLE_HOURS."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="lag_samples")
    at = models.DateTimeField()
    records = models.BigIntegerField(null=True, help_text="Null: Kafka could not be asked.")
    seconds = models.FloatField(null=True, help_text="Age of the oldest unprocessed record.")
    # The sum of the offsets the job has committed: it moves when the job makes progress.
    committed = models.BigIntegerField(null=True)

    class Meta:
        ordering = ["pipeline", "at"]
        indexes = [models.Index(fields=["pipeline", "at"]), models.Index(fields=["at"])]

    def __str__(self) -> str:
        return f"{self.pipeline.name} lag at {self.at:%H:%M:%S}"


class PipelineFigures(models.Model):
    """A pipeline's figures (checkpoint, lag, backpressure, throughput) as the metrics
    collector last computed them: what the overview, the pipeline page, the API and
    Prometheus show, with `collected_at` saying how fresh. The columns beside `figures` are
    what the overview sorts and classifies by."""

    pipeline = models.OneToOneField(
        Pipeline, primary_key=True, on_delete=models.CASCADE, related_name="figures"
    )
    collected_at = models.DateTimeField()
    figures = models.JSONField(default=dict)
    lag_records = models.BigIntegerField(null=True)
    lag_seconds = models.FloatField(null=True)
    lag_status = models.CharField(max_length=16, blank=True)
    lag_error = models.TextField(blank=True)
    backpressure = models.CharField(max_length=16, blank=True)
    # The checkpoint's last commit as the round saw it (what health asks, without the JSON).
    last_commit_at = models.DateTimeField(null=True, blank=True)
    # How long until Kafka's retention may delete records it has not read (None: nothing
    # unread under time-based retention).
    data_loss_seconds = models.FloatField(null=True, blank=True)
    # Where a pipeline that has committed nothing yet starts reading ({topic: {partition:
    # offset}}), as first resolved: its lag counts from there, not from the topic's start.
    start_offsets = models.JSONField(null=True, blank=True)
    # Records that did not parse, in the sink database's dead-letter table now (None: not
    # counted: its database did not answer, or it was never counted).
    dead_letters = models.BigIntegerField(null=True, blank=True)
    # A schema-registry source's writer-schema sampling (controlplane.observability.
    # writer_schemas): when it last sampled, and up to which offset ({topic: {partition:
    # offset}}); None: never sampled.
    writers_sampled_at = models.DateTimeField(null=True, blank=True)
    writers_sampled_to = models.JSONField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.pipeline.name} figures at {self.collected_at:%H:%M:%S}"


class WriterSchema(models.Model):
    """A writer schema seen in a schema-registry source's topics: the schema id the newest
    records carry (sampled by the metrics collector), its version in the subject the
    pipeline reads, and when it was first and last seen. `schema_id` None: records that are
    not in Confluent's wire format."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="writer_schemas")
    schema_id = models.BigIntegerField(null=True, blank=True)
    # The subject and version this id is registered as: the pipeline's own subject when it
    # is one of its versions, else the first the registry named; "" and None: not known
    # (yet: looked up again while `looked_up` is False).
    subject = models.CharField(max_length=255, blank=True)
    version = models.PositiveIntegerField(null=True, blank=True)
    looked_up = models.BooleanField(default=False)
    lookup_error = models.TextField(blank=True)
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    # When it appeared while the pipeline's topics were already watched (None: it was there
    # when watching began): what the writer-schema alert rule reports.
    appeared_at = models.DateTimeField(null=True, blank=True)
    records = models.PositiveBigIntegerField(default=0, help_text="Sampled records with it.")

    class Meta:
        ordering = ["pipeline", "first_seen_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["pipeline", "schema_id"],
                name="writer_schema_once_per_pipeline",
                nulls_distinct=False,
            )
        ]

    def __str__(self) -> str:
        return f"{self.pipeline.name} writer schema {self.schema_id}"


class StateStore(models.TextChoices):
    """Which state store provider keeps an operator's state, deduced from the metrics it
    reports (Spark does not name it in the progress)."""

    ROCKSDB = "rocksdb", "RocksDB"  # rocksdb* custom metrics; its size is on disk
    HDFS = "hdfs", "HDFS-backed (Spark's default)"  # its state is held in memory
    UNKNOWN = "", "Unknown"


class StateSample(models.Model):
    """One stateful operator's state after one micro-batch (StateOperatorProgress, the useful
    part; the operator is its index in the query's `stateOperators`). Kept raw as long as
    the batch progress it came with (CONTROLPLANE_PROGRESS_RAW_HOURS), then rolled up per
    hour (StateRollup)."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="state_samples")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="state_samples")
    batch_id = models.BigIntegerField()
    operator = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=100, blank=True)
    store = models.CharField(max_length=16, choices=StateStore.choices, blank=True)
    at = models.DateTimeField(help_text="When the batch was reported (its progress' reported_at).")
    rows = models.BigIntegerField(null=True, help_text="numRowsTotal: rows held in state.")
    rows_updated = models.BigIntegerField(null=True)
    rows_removed = models.BigIntegerField(null=True)
    memory_bytes = models.BigIntegerField(null=True, help_text="memoryUsedBytes.")
    size_bytes = models.BigIntegerField(
        null=True,
        help_text="RocksDB: its SST files on disk (rocksdbSstFileSize); the HDFS-backed store: "
        "its current version, in memory (stateOnCurrentVersionSizeBytes).",
    )
    rows_dropped = models.BigIntegerField(
        null=True, help_text="numRowsDroppedByWatermark: late rows dropped in this batch."
    )
    commit_ms = models.BigIntegerField(null=True, help_text="commitTimeMs: the state's commit.")
    checkpoint_ms = models.BigIntegerField(
        null=True, help_text="The batch's durationMs.walCommit + commitOffsets."
    )
    store_checkpoint_ms = models.BigIntegerField(
        null=True, help_text="RocksDB's rocksdbCommitCheckpointLatency."
    )

    class Meta:
        ordering = ["pipeline", "operator", "at"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "batch_id", "operator"], name="one_state_sample_per_operator"
            )
        ]
        indexes = [
            models.Index(fields=["pipeline", "operator", "at"], name="state_sample_series"),
            models.Index(fields=["at"], name="state_sample_age"),
        ]

    def __str__(self) -> str:
        return f"{self.pipeline_id} batch {self.batch_id} operator {self.operator}"


class StateRollup(models.Model):
    """One stateful operator's samples older than the raw retention, per pipeline and hour:
    sums, counts and maxima, so rolling a bucket up in several passes gives the same figures.
    Kept CONTROLPLANE_PROGRESS_ROLLUP_DAYS."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="state_rollups")
    operator = models.PositiveSmallIntegerField()
    bucket_start = models.DateTimeField()
    bucket_seconds = models.PositiveIntegerField(default=3600)
    name = models.CharField(max_length=100, blank=True)
    store = models.CharField(max_length=16, choices=StateStore.choices, blank=True)
    batches = models.PositiveBigIntegerField(default=0)
    sum_rows = models.FloatField(default=0.0)
    max_rows = models.BigIntegerField(default=0)
    sum_rows_updated = models.FloatField(default=0.0)
    sum_rows_removed = models.FloatField(default=0.0)
    sum_memory_bytes = models.FloatField(default=0.0)
    max_memory_bytes = models.BigIntegerField(default=0)
    sized_batches = models.PositiveBigIntegerField(default=0)
    sum_size_bytes = models.FloatField(default=0.0)
    max_size_bytes = models.BigIntegerField(default=0)
    rows_dropped = models.PositiveBigIntegerField(default=0)
    sum_commit_ms = models.FloatField(default=0.0)
    max_commit_ms = models.BigIntegerField(default=0)
    checkpointed_batches = models.PositiveBigIntegerField(default=0)
    sum_checkpoint_ms = models.FloatField(default=0.0)
    max_checkpoint_ms = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["pipeline", "operator", "bucket_start"]
        constraints = [
            models.UniqueConstraint(
                fields=["pipeline", "operator", "bucket_start", "bucket_seconds"],
                name="one_state_rollup_per_bucket",
            )
        ]

    def __str__(self) -> str:
        return f"{self.pipeline_id} operator {self.operator} {self.bucket_start:%Y-%m-%d %H:%M}"


class StateOperator(models.Model):
    """A pipeline's stateful operator as last reported: its latest figures (what the page's
    "now", the metrics API and Prometheus show, one row per operator whatever the batch
    rate) and the late rows it dropped, summed over every batch reported (Prometheus'
    counter). The total starts again when another operator takes the index (a new query
    shape)."""

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="state_operators")
    operator = models.PositiveSmallIntegerField()
    name = models.CharField(max_length=100, blank=True)
    store = models.CharField(max_length=16, choices=StateStore.choices, blank=True)
    # The batch the figures are from: a report of an older batch (a retry) changes nothing.
    run = models.ForeignKey(Run, null=True, on_delete=models.SET_NULL, related_name="+")
    batch_id = models.BigIntegerField()
    at = models.DateTimeField()
    latest = models.JSONField(default=dict, help_text="The batch's figures (as StateSample).")
    rows_dropped_total = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["pipeline", "operator"]
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "operator"], name="one_row_per_operator")
        ]

    def __str__(self) -> str:
        return f"{self.pipeline_id} operator {self.operator} ({self.name})"
