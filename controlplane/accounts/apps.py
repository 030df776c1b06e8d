from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "controlplane.accounts"
    label = "accounts"
    verbose_name = "API access"

    def ready(self) -> None:
        from axes.signals import user_locked_out
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from . import security

        # Failed and successful sign-ins and lockouts, to the controlplane.security log.
        user_login_failed.connect(security.login_failed, dispatch_uid="cp-security-login-failed")
        user_logged_in.connect(security.logged_in, dispatch_uid="cp-security-logged-in")
        user_locked_out.connect(security.locked_out, dispatch_uid="cp-security-locked-out")
