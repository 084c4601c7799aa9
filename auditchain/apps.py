from django.apps import AppConfig


class AuditChainConfig(AppConfig):
    """The audit log's tamper evidence: each entry's authentication code checked, and
    the entries chained in the order they were written (docs/security.md)."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "auditchain"
    verbose_name = "Audit chain"
