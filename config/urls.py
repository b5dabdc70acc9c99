from django.contrib import admin
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from chat.views import ws_chat_upgrade_required
from hearth import pages, signin
from hearth.api import api, v1
from hub import views as hub_views
from serving.routes import curve_designer, listing, model_slots, ops

urlpatterns = [
    path("v1/", v1.urls),
    path("v1", listing.index_view),
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
    path("models", model_slots.models_list),
    path("models/load", csrf_exempt(model_slots.models_load)),
    path("models/unload", csrf_exempt(model_slots.models_unload)),
    path("models/pin", csrf_exempt(model_slots.models_pin)),
    path("models/default", csrf_exempt(model_slots.models_default)),
    path("models/sse", model_slots.models_sse),
    path("admin/cache/session/close", ops.cache_session_close),
    path("admin/cache/flush", ops.cache_flush),
    path("admin/transcription/unload", ops.transcription_unload),
    path("admin/", admin.site.urls),
    path("", pages.shell),
    path("curves", pages.curves),
    path("signal", curve_designer.signal),
    path("generate", curve_designer.generate),
    *[path(page, pages.legacy, {"page": page}) for page in ("status", "chat", "quantize", "finetune", "dataset")],
]

handler404 = "hearth.views.not_found"
