"""URL configuration of the console."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from broker.api import api
from console import views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.health_page, name="health"),
    path("healthz.json", views.health_json, name="health-json"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
