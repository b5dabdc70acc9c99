from django.apps import AppConfig


class HubConfig(AppConfig):
    name = "hub"
    default_auto_field = "django.db.models.BigAutoField"
