from django.contrib import admin

from .models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "hint", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username")
    readonly_fields = ("user", "name", "hint", "created_at", "last_used_at")
    fields = ("user", "name", "hint", "created_at", "last_used_at", "revoked_at")

    def has_add_permission(self, request) -> bool:
        # The key is shown only once, which the admin cannot do: use `manage.py create_api_token`.
        return False
