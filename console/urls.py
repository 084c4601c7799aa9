"""URL configuration of the console."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from broker.api import api
from console.views import (
    audit,
    clients,
    events,
    fleet,
    lockouts,
    overview,
    policies,
    reports,
    send,
    tree,
    trust,
    why,
)

urlpatterns = [
    path("", overview.home, name="home"),
    path("healthz", overview.health_page, name="health"),
    path("healthz.json", overview.health_json, name="health-json"),
    path("fleet/", fleet.fleet, name="fleet"),
    path("fleet/actions", fleet.bulk_action, name="fleet-bulk"),
    path("clients/<str:name>/", clients.client_page, name="client"),
    path("clients/<str:name>/tokens", clients.tokens, name="client-tokens"),
    path("clients/<str:name>/sending", clients.sending, name="client-sending"),
    path("clients/<str:name>/why", clients.why_form, name="client-why"),
    path("events/<uuid:event_id>/why/<str:name>/", why.why_page, name="event-why"),
    path("events/<uuid:event_id>/why", why.why_lookup, name="event-why-lookup"),
    path("policies/", policies.editor, name="policy-editor"),
    path("policies/check", policies.check, name="policy-check"),
    path("policies/preview", policies.preview, name="policy-preview"),
    path("policies/save", policies.save, name="policy-save"),
    path("tree/", tree.tree, name="tree"),
    path("trust/", trust.trust_page, name="trust"),
    path("trust/preview", trust.preview, name="trust-preview"),
    path("trust/apply", trust.apply, name="trust-apply"),
    path("trust/authorities/<slug:name>", trust.manage_authority, name="authority-manage"),
    path("send/", send.compose, name="send"),
    path("send/preview", send.preview, name="send-preview"),
    path("send/go", send.send, name="send-go"),
    path("events/", events.event_list, name="events"),
    path("events/<uuid:event_id>/", events.event_page, name="event"),
    path("events/<uuid:event_id>/resend", send.resend, name="event-resend"),
    path("audit/", audit.audit_log, name="audit-log"),
    path("audit/export.csv", audit.export_csv, name="audit-export"),
    path("reports/", reports.report_index, name="reports"),
    path("reports/<slug:kind>/", reports.report_page, name="report"),
    path("reports/<slug:kind>/run", reports.run_report, name="report-run"),
    path("reports/runs/<int:run_id>/<slug:section>.csv", reports.export_csv, name="report-csv"),
    path("lockouts/", lockouts.lockouts, name="lockouts"),
    path("lockouts/lift", lockouts.lift, name="lockout-lift"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
