from django.contrib.auth.views import LogoutView
from django.urls import include, path

from console import signin

urlpatterns = [
    # Django's LoginView behind the sign-in throttle (429 while a name or an address is
    # locked out) and a wrapper that turns an htmx request (a poll after the session
    # ended) into a full-page redirect; see console.signin and console.views.sign_in.
    path("login/", signin.sign_in, name="login"),
    # LogoutView accepts POST only, so a link or an <img> cannot sign anyone out.
    path("logout/", LogoutView.as_view(next_page="login"), name="logout"),
    # Liveness, readiness and Prometheus metrics (reconciler.views): no sign-in.
    path("", include("reconciler.urls")),
    path("", include("console.urls")),
]

# 404.html, 500.html (standalone: it renders without a request) and 403.html are the
# product's own pages, used whenever DEBUG is off — production always, the demo too.
# A refused request is logged as one line (user, path, reason), not a traceback.
handler403 = "console.views.permission_denied"
