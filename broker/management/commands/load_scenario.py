"""Load the worm-response scenario (SCENARIO.md) once, for the demo and the benches."""

import time

from django.core.management.base import BaseCommand

from broker.models import ClientModel
from broker.scenario import bulk_add_web_servers, load_scenario


class Command(BaseCommand):
    help = "Create the scenario's models, authorities, controllers and web servers, once."

    def add_arguments(self, parser):
        parser.add_argument("--servers", type=int, default=40, help="web servers to create")
        parser.add_argument(
            "--bulk",
            action="store_true",
            help="add the web servers with COPY (100,000 in about a minute), and add "
            "the missing ones to a scenario already loaded",
        )

    def handle(self, *args, servers: int, bulk: bool, **options):
        loaded = ClientModel.objects.filter(name="web-server").exists()
        if bulk:
            self._load_in_bulk(servers, loaded=loaded)
        elif loaded:
            self.stdout.write("The scenario is already loaded.")
        else:
            scenario = load_scenario(servers=servers)
            self.stdout.write(
                self.style.SUCCESS(
                    f"Loaded the scenario: {len(scenario.controllers)} controllers, "
                    f"{len(scenario.servers)} web servers, 2 authorities."
                )
            )

    def _load_in_bulk(self, servers: int, *, loaded: bool) -> None:
        started = time.monotonic()
        if not loaded:
            load_scenario(servers=0)
        added = bulk_add_web_servers(servers)
        self.stdout.write(
            self.style.SUCCESS(
                f"Added {added} web servers in bulk ({servers - added} existed already) "
                f"in {time.monotonic() - started:.1f} s."
            )
        )
