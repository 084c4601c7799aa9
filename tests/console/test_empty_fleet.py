"""The Fleet page before any client is registered (the page's other tests share a
loaded fleet, tests/module_data.py)."""

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_the_empty_fleet_says_how_to_register_clients(as_auditor):
    body = as_auditor.get(reverse("fleet")).content.decode()
    assert "No client is registered yet" in body
