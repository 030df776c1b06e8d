from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pipelines", "0008_audit_connections"),
    ]

    operations = [
        migrations.AddField(
            model_name="pipeline",
            name="status_message",
            field=models.TextField(blank=True, default=""),
        ),
        migrations.AddField(
            model_name="run",
            name="process_started",
            field=models.FloatField(
                blank=True, help_text="The supervisor's start time (Unix time, psutil).", null=True
            ),
        ),
    ]
