"""Re-encrypt connection secrets stored under the key earlier versions derived from
SECRET_KEY with the secrets' own key (controlplane/crypto.py). Rows that neither opens are
left as they are (their secrets must be entered again, as before)."""

from cryptography.fernet import InvalidToken
from django.conf import settings
from django.db import migrations


def reencrypt(apps, schema_editor):
    from controlplane import crypto

    Connection = apps.get_model("connections", "Connection")
    legacy = crypto.legacy_fernet(settings.SECRET_KEY)
    for row in Connection.objects.exclude(secrets_encrypted=""):
        try:
            crypto.current().decrypt(row.secrets_encrypted.encode())
            continue  # already under a configured key
        except InvalidToken:
            pass
        try:
            plain = legacy.decrypt(row.secrets_encrypted.encode())
        except InvalidToken:
            continue
        row.secrets_encrypted = crypto.current().encrypt(plain).decode()
        row.save(update_fields=["secrets_encrypted"])


class Migration(migrations.Migration):
    dependencies = [("connections", "0001_initial")]

    operations = [migrations.RunPython(reencrypt, migrations.RunPython.noop)]
