"""Queue every report over the last day now (the beat does it every REPORTS_INTERVAL_S)."""

from django.core.management.base import BaseCommand

from reports.models import ReportRun
from reports.services import schedule_reports


class Command(BaseCommand):
    help = (
        "Queue every report over the last day, for the reports worker to run. With "
        "--if-never-run, only when no report has ever been run (the demo's first start)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--if-never-run", action="store_true")

    def handle(self, *args, if_never_run: bool = False, **options):
        if if_never_run and ReportRun.objects.exists():
            self.stdout.write("reports have run before; none queued")
            return
        runs = schedule_reports()
        self.stdout.write(f"queued {len(runs)} reports: " + ", ".join(r.kind for r in runs))
