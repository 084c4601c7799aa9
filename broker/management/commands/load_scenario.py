"""Load the worm-response scenario (SCENARIO.md) once, for the demo."""

from pathlib import Path

from django.core.management.base import BaseCommand

from broker.models import ClientModel
from broker.scenario import demo_keys, load_scenario
from launcher.demo_settings import demo_keys_file, write_demo_keys


class Command(BaseCommand):
    help = (
        "Create the scenario's models, authorities, controllers and web servers, once, "
        "and keep the authorities' keys and the clients' grant keys in a file only you read."
    )

    def add_arguments(self, parser):
        parser.add_argument("--servers", type=int, default=40, help="web servers to create")
        parser.add_argument(
            "--keys-file",
            type=Path,
            default=None,
            help=f"where to keep the keys (default: {demo_keys_file()})",
        )

    def handle(self, *args, servers: int, keys_file: Path | None, **options):
        if ClientModel.objects.filter(name="web-server").exists():
            self.stdout.write("The scenario is already loaded.")
            return
        scenario = load_scenario(servers=servers)
        path = write_demo_keys(keys_file or demo_keys_file(), demo_keys(scenario))
        self.stdout.write(
            self.style.SUCCESS(
                f"Loaded the scenario: {len(scenario.controllers)} controllers, "
                f"{len(scenario.servers)} web servers, 2 authorities; their keys are in {path}."
            )
        )
