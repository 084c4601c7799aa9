"""Load the worm-response scenario (SCENARIO.md) once, for the demo."""

from django.core.management.base import BaseCommand

from broker.models import ClientModel
from broker.scenario import load_scenario


class Command(BaseCommand):
    help = "Create the scenario's models, authorities, controllers and web servers, once."

    def add_arguments(self, parser):
        parser.add_argument("--servers", type=int, default=40, help="web servers to create")

    def handle(self, *args, servers: int, **options):
        if ClientModel.objects.filter(name="web-server").exists():
            self.stdout.write("The scenario is already loaded.")
            return
        scenario = load_scenario(servers=servers)
        self.stdout.write(
            self.style.SUCCESS(
                f"Loaded the scenario: {len(scenario.controllers)} controllers, "
                f"{len(scenario.servers)} web servers, 2 authorities."
            )
        )
