"""URL configuration of the console."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from broker.api import api
from console.views import clients, fleet, overview, policies, tree, trust

urlpatterns = [
    path("", overview.home, name="home"),
    path("healthz", overview.health_page, name="health"),
    path("healthz.json", overview.health_json, name="health-json"),
    path("fleet/", fleet.fleet, name="fleet"),
    path("fleet/actions", fleet.bulk_action, name="fleet-bulk"),
    path("clients/<str:name>/", clients.client_page, name="client"),
    path("clients/<str:name>/tokens", clients.tokens, name="client-tokens"),
    path("policies/", policies.editor, name="policy-editor"),
    path("policies/check", policies.check, name="policy-check"),
    path("policies/preview", policies.preview, name="policy-preview"),
    path("policies/save", policies.save, name="policy-save"),
    path("tree/", tree.tree, name="tree"),
    path("trust/", trust.trust_page, name="trust"),
    path("trust/preview", trust.preview, name="trust-preview"),
    path("trust/apply", trust.apply, name="trust-apply"),
    path("trust/authorities/<slug:name>", trust.manage_authority, name="authority-manage"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
