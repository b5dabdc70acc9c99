from django.contrib import admin
from django.urls import path

from chat.views import ws_chat_upgrade_required
from config import frontend, signin, views
from config.api import api, v1
from hub import views as hub_views

urlpatterns = [
    path("v1/", v1.urls),
    path("v1", views.api_index),
    path("api/", api.urls),
    path("health", views.health),
    path("signin", signin.signin),
    path("signout", signin.signout),
    path("auth", signin.auth_state),
    path("stats", views.stats),
    path("metrics", views.metrics),
    path("library", hub_views.library_view),
    path("fit", hub_views.fit_view),
    path("downloads", hub_views.downloads_view),
    path("ws/chat", ws_chat_upgrade_required),
    path("admin/cache/session/close", views.cache_session_close),
    path("admin/cache/flush", views.cache_flush),
    path("admin/", admin.site.urls),
    path("", frontend.shell),
    path("assets/<path:name>", frontend.asset),
    path("manifest.webmanifest", frontend.manifest),
    path("sw.js", frontend.service_worker),
    *[path(page, frontend.legacy, {"page": page}) for page in ("status", "chat", "quantize", "finetune", "dataset")],
]

handler404 = "config.views.not_found"
