from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("pipelines", "0009_run_identity"),
    ]

    operations = [
        migrations.AddField(
            model_name="reconcilerstate",
            name="resumed_at",
            field=models.DateTimeField(null=True),
        ),
    ]
