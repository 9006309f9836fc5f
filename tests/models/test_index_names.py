"""Every index PILOT creates is named `pilot_…` (issue 30, F2): index names are
schema-wide, and Django refuses two models with an index of the same name
(models.E030), so a host's `task_created_idx` must not meet one of PILOT's."""

from django.apps import apps


def test_every_index_of_pilots_models_is_prefixed():
    names = [index.name for model in apps.get_app_config("workflows").get_models()
             for index in model._meta.indexes]
    assert names and all(name.startswith("pilot_") for name in names), names
