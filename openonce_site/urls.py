from django.contrib.auth.views import LogoutView
from django.urls import include, path

from console import views as console_views

urlpatterns = [
    # Django's LoginView behind a small wrapper that turns an htmx request (a poll after
    # the session ended) into a full-page redirect; see console.views.sign_in.
    path("login/", console_views.sign_in, name="login"),
    # LogoutView accepts POST only, so a link or an <img> cannot sign anyone out.
    path("logout/", LogoutView.as_view(next_page="login"), name="logout"),
    # Liveness, readiness and Prometheus metrics (reconciler.views): no sign-in.
    path("", include("reconciler.urls")),
    path("", include("console.urls")),
]
