from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pipelines", "0007_progress_state"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditentry",
            name="connection_name",
            field=models.CharField(blank=True, db_index=True, default="", max_length=63),
        ),
        migrations.AlterField(
            model_name="auditentry",
            name="pipeline_name",
            field=models.CharField(blank=True, db_index=True, default="", max_length=63),
        ),
    ]
