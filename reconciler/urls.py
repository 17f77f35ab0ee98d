from django.urls import path

from . import views

urlpatterns = [
    path("livez", views.livez, name="livez"),
    path("readyz", views.readyz, name="readyz"),
    path("metrics", views.metrics, name="metrics"),
    # Only the verdict without the token or a sign-in (reconciler.views.health).
    path("health/", views.health, name="health"),
]
