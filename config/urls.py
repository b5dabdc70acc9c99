from django.contrib import admin
from django.urls import path

from chat.views import ws_chat_upgrade_required
from hearth import pages, signin
from hearth.api import api, ops_api, v1
from hub import views as hub_views
from serving.routes import listing

urlpatterns = [
    path("v1/", v1.urls),
    path("v1", listing.index_view),
    path("api/", api.urls),
    path("", pages.shell),  # before the operations API, whose own root answers 404
    # /health, /stats, /metrics, /models/*, /admin/cache/*, /admin/transcription/unload, /signal, /generate
    path("", ops_api.urls),
    path("signin", signin.signin),
    path("signout", signin.signout),
    path("auth", signin.auth_state),
    path("library", hub_views.library_view),
    path("fit", hub_views.fit_view),
    path("downloads", hub_views.downloads_view),
    path("ws/chat", ws_chat_upgrade_required),
    path("admin/", admin.site.urls),
    path("curves", pages.curves),
    path("curve-terrain", pages.curve_terrain),
    *[path(page, pages.legacy, {"page": page}) for page in ("status", "chat", "quantize", "finetune", "dataset")],
    path("dag", pages.legacy, {"page": "lineage"}),  # the contract's lineage page is the dashboard's
]

handler404 = "hearth.views.not_found"
