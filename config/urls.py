from django.contrib import admin
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from chat.views import ws_chat_upgrade_required
from config import frontend, signin
from config.api import api, v1
from hub import views as hub_views
from inference.routes import curves, ops
from inference.routes import models as v1_models
from inference.routes import router as models_routes

urlpatterns = [
    path("v1/", v1.urls),
    path("v1", v1_models.index_view),
    path("api/", api.urls),
    path("health", ops.health),
    path("signin", signin.signin),
    path("signout", signin.signout),
    path("auth", signin.auth_state),
    path("stats", ops.stats),
    path("metrics", ops.metrics),
    path("library", hub_views.library_view),
    path("fit", hub_views.fit_view),
    path("downloads", hub_views.downloads_view),
    path("ws/chat", ws_chat_upgrade_required),
    path("models", models_routes.models_list),
    path("models/load", csrf_exempt(models_routes.models_load)),
    path("models/unload", csrf_exempt(models_routes.models_unload)),
    path("models/pin", csrf_exempt(models_routes.models_pin)),
    path("models/default", csrf_exempt(models_routes.models_default)),
    path("models/sse", models_routes.models_sse),
    path("admin/cache/session/close", ops.cache_session_close),
    path("admin/cache/flush", ops.cache_flush),
    path("admin/transcription/unload", ops.transcription_unload),
    path("admin/", admin.site.urls),
    path("", frontend.shell),
    path("curves", frontend.curves),
    path("signal", curves.signal),
    path("generate", curves.generate),
    *[path(page, frontend.legacy, {"page": page}) for page in ("status", "chat", "quantize", "finetune", "dataset")],
]

handler404 = "config.views.not_found"
