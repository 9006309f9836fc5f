from django.urls import path

from bench.ceiling.views import BareInsertView

urlpatterns = [path("ceiling", BareInsertView.as_view(), name="bench-ceiling")]
