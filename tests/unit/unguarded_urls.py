"""A project that mounts the admin without PILOT's guarded password change."""

from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
