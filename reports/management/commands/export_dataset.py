"""Bring the reports' Parquet dataset up to date now (each report run does it first)."""

from django.core.management.base import BaseCommand

from reports.export import dataset_root, export_changes


class Command(BaseCommand):
    help = (
        "Export what changed since the last export to the Parquet dataset "
        "(REPORTS_DATASET), and print the rows written per table."
    )

    def handle(self, *args, **options):
        result = export_changes()
        written = ", ".join(f"{table} {rows:,}" for table, rows in result.rows.items())
        self.stdout.write(
            f"exported to {dataset_root()} in {result.seconds:.1f} s "
            f"(below txid {result.watermark}): {written}"
        )
