"""Load the worm-response scenario (docs/scenario.md) once, for the demo and the benches."""

import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from broker.models import ClientModel
from demo.data_folder import KeysFileExists, check_keys_file_is_new, demo_keys_file, write_demo_keys
from demo.scenario import (
    bulk_add_web_servers,
    demo_keys,
    ensure_signing_keys,
    load_scenario,
    offer_send_templates,
)


class Command(BaseCommand):
    help = "Create the scenario's models, authorities, controllers and web servers."

    def add_arguments(self, parser):
        parser.add_argument("--servers", type=int, default=40, help="web servers to create")
        parser.add_argument(
            "--bulk",
            action="store_true",
            help="add the web servers with COPY (100,000 in about a minute), and add "
            "the missing ones to a scenario already loaded",
        )
        parser.add_argument(
            "--keys-file",
            type=Path,
            default=None,
            help="where to keep the keys, a new file: one that is there is never replaced "
            f"(default: {demo_keys_file()})",
        )

    def handle(self, *args, servers: int, bulk: bool, keys_file: Path | None, **options):
        loaded = ClientModel.objects.filter(name="web-server").exists()
        if not loaded:
            self._load(servers=0 if bulk else servers, keys_file=keys_file or demo_keys_file())
        elif not bulk:
            self.stdout.write("The scenario is already loaded.")
        if bulk:
            self._load_in_bulk(servers)
        made = ensure_signing_keys()
        if made:
            self.stdout.write(f"Made signing keys for {', '.join(made)} (SIGNING_KEYS_DIR).")
        offered = offer_send_templates()  # for a scenario loaded before they were kept
        if offered:
            self.stdout.write(f"Offered ready-made sends on the Send page: {', '.join(offered)}.")

    def _load(self, *, servers: int, keys_file: Path) -> None:
        """Load the scenario and keep its keys in `keys_file`, a new file, or neither:
        the keys are shown once, so a scenario whose keys cannot be kept is not loaded."""
        try:
            check_keys_file_is_new(keys_file)
            with transaction.atomic():
                scenario = load_scenario(servers=servers)
                path = write_demo_keys(keys_file, demo_keys(scenario))
        except KeysFileExists as error:
            raise CommandError(str(error)) from None
        self.stdout.write(
            self.style.SUCCESS(
                f"Loaded the scenario: {len(scenario.controllers)} controllers, "
                f"{len(scenario.servers)} web servers, 2 authorities; their keys are in {path}."
            )
        )

    def _load_in_bulk(self, servers: int) -> None:
        started = time.monotonic()
        added = bulk_add_web_servers(servers)
        self.stdout.write(
            self.style.SUCCESS(
                f"Added {added} web servers in bulk ({servers - added} existed already) "
                f"in {time.monotonic() - started:.1f} s."
            )
        )
