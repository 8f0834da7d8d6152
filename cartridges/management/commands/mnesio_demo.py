"""`manage.py mnesio_demo [--base-url URL]`: a ready-to-try demo, safe to run again.

Creates (or finds) the demo scope, an operator account (staff, for the admin and the dashboard) with an
API token granted the scope, appends a dozen memories of a small fictional office assistant about a few
people (idempotency keys: a second run appends nothing), attaches evaluation cases, compiles the scope,
runs the gate, activates the cartridge, asks one question through the API's own view (token auth,
serializer, service), and prints the token, sample curl commands and the dashboard's address.
"""
from __future__ import annotations

import json
import os
import secrets
import shlex
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from knox.crypto import hash_token
from knox.models import AuthToken
from rest_framework.test import APIRequestFactory

from cartridges import selectors
from cartridges.api.views import AskView
from cartridges.services import (
    GateFailed,
    cartridge_activate,
    cartridge_compile,
    cartridge_evaluate,
    evaluation_case_add,
)
from core.errors import MnesioError
from kvengine import ANSWER_MODES
from memories.models import Scope
from memories.selectors import log_head
from memories.services import memory_append, scope_create, scope_grant

# The demo's data (memories with their idempotency keys and subjects, the gate's evaluation cases, the question
# bin/run asks) lives in demo_scope.json beside this file.
_DEMO = json.loads((Path(__file__).with_name("demo_scope.json")).read_text(encoding="utf-8"))
MEMORIES = [(m["idempotency_key"], m["subject"], m["content"]) for m in _DEMO["memories"]]
CASES = [(case["question"], case["answers"]) for case in _DEMO["cases"]]
QUESTION = _DEMO["question"]


class Command(BaseCommand):
    help = "Create a demo scope, operator and token, append demo memories, compile, gate, activate, and ask."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--scope", default="demo", help="the demo scope's name (default: demo)")
        parser.add_argument("--username", default="operator", help="the operator account (default: operator)")
        parser.add_argument(
            "--password",
            default=os.environ.get("MNESIO_DEMO_PASSWORD", ""),
            help="set the operator's password (default: $MNESIO_DEMO_PASSWORD, else generated once and kept "
            "in DATA_DIR/demo-operator-password)",
        )
        parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="where the server will listen")

    def handle(self, *args: Any, **options: Any) -> None:
        base = options["base_url"].rstrip("/")
        scope = Scope.objects.filter(name=options["scope"]).first() or scope_create(
            name=options["scope"], description="Pip, a small office assistant: what it remembers about the team (demo)"
        )
        user, password_note = self._operator(options["username"], options["password"])
        scope_grant(scope=scope, user=user, actor=user)
        token = self._token(user)

        appended = sum(
            memory_append(scope=scope, subject=subject, content=text, idempotency_key=key, actor=user).appended
            for key, subject, text in MEMORIES
        )
        known = {case.question for case in selectors.scope_evaluation_cases_open(scope=scope)}
        for question, answers in CASES:
            if question not in known:
                evaluation_case_add(scope=scope, question=question, answers=answers, actor=user)
        self.stdout.write(f"scope '{scope.name}': {appended} memories appended ({scope.memories.count()} in all), "
                          f"log head {log_head()}")

        config = selectors.active_configuration()
        self.stdout.write(f"KV configuration: {config.key()} on {config.device}; compiling (the first run loads the model)")
        try:
            version = cartridge_compile(scope=scope, actor=user)
        except MnesioError as exc:
            raise CommandError(f"compiling scope '{scope.name}' failed: {exc.message}") from None
        self._gate(version, user)
        self._ask(scope, token, base)
        self._instructions(scope, user, token, password_note, base)

    def _operator(self, username: str, password: str) -> tuple[Any, str]:
        """Find or create the operator (staff + superuser: admin actions and the dashboard); say how to log in."""
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        stored = Path(settings.DATA_DIR) / "demo-operator-password"
        if user is None:
            generated = not password
            password = password or secrets.token_urlsafe(12)
            user = User.objects.create_superuser(username=username, email="", password=password)
            if generated:  # kept (owner-only) so a second run can print it again
                stored.parent.mkdir(parents=True, exist_ok=True)
                stored.write_text(password + "\n")
                stored.chmod(0o600)
            return user, f"password {password}"
        if password:
            user.set_password(password)
            user.save(update_fields=["password"])
            return user, f"password {password}"
        if stored.exists() and user.check_password(stored.read_text().strip()):
            return user, f"password {stored.read_text().strip()}"
        return user, "password unchanged (set one with --password or `manage.py changepassword`)"

    def _token(self, user: Any) -> str:
        """The operator's demo API token: stored hashed (knox); the secret is kept owner-only in DATA_DIR so a
        second run can print it again (as the generated password), else a new one is made."""
        stored = Path(settings.DATA_DIR) / "demo-api-token"
        if stored.exists():
            key = stored.read_text().strip()
            if AuthToken.objects.filter(user=user, digest=hash_token(key)).exists():
                return key
        _, key = AuthToken.objects.create(user=user, expiry=None)
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_text(key + "\n")
        stored.chmod(0o600)
        return key

    def _gate(self, version: Any, user: Any) -> None:
        """Evaluate (unless a current evaluation exists) and activate through the gate; report the figures."""
        state = selectors.version_state(version=version)
        self.stdout.write(f"cartridge version {version.pk}: {version.num_memories} memories, {version.num_tokens} "
                          f"tokens, {version.size_bytes} bytes ({state})")
        if state != "active":
            evaluation = selectors.version_latest_evaluation(version=version, config_key=selectors.active_configuration().key())
            if evaluation is None:
                evaluation = cartridge_evaluate(version=version, actor=user)
            figures = evaluation.figures or {}
            fidelity = (figures.get("fidelity") or {}).get("top1_agreement")
            accuracy = figures.get("accuracy") or {}
            self.stdout.write(
                f"gate: {'passed' if evaluation.passed else 'FAILED'}; fidelity {fidelity}, accuracy on "
                f"{accuracy.get('num_cases', 0)} cases: cartridge {accuracy.get('cartridge')}, "
                f"text {accuracy.get('text')}, top-k retrieval {accuracy.get('retrieval')}"
            )
            try:
                cartridge_activate(version=version, actor=user)
            except GateFailed as exc:
                self.stdout.write(self.style.WARNING(f"not activated: {exc.message}"))
                for reason in exc.reasons:
                    self.stdout.write(self.style.WARNING(f"  - {reason}"))
                return
        self.stdout.write(self.style.SUCCESS(f"cartridge version {version.pk} is active"))

    def _ask(self, scope: Scope, token: str, base: str) -> None:
        """Ask one question through the API's view (token auth, serializer, service), in both modes."""
        factory = APIRequestFactory()
        view = AskView.as_view()
        for mode in ANSWER_MODES:
            request = factory.post(
                f"/api/v1/scopes/{scope.name}/ask/", {"question": QUESTION, "mode": mode}, format="json",
                HTTP_AUTHORIZATION=f"Token {token}",
            )
            response = view(request, scope=scope.name)
            body = response.data
            if response.status_code != 200:
                self.stdout.write(self.style.WARNING(f"ask ({mode}): {response.status_code} {body.get('message')}"))
                continue
            self.stdout.write(
                f"asked {QUESTION!r} (mode={mode}): {body['answer']!r} "
                f"[version {body['version_id']}, first token {body['ttft_s']:.3f} s, total {body['total_s']:.3f} s]"
            )

    def _instructions(self, scope: Scope, user: Any, token: str, password_note: str, base: str) -> None:
        auth = f'-H "Authorization: Bearer {token}"'
        json_header = "-H 'Content-Type: application/json'"
        api = f"{base}/api/v1/scopes/{scope.name}"

        def body(data: dict[str, Any]) -> str:
            return f"{json_header} -d {shlex.quote(json.dumps(data))}"

        new_memory = body({"content": "Mira moved to the third floor.", "subject": "mira"})
        compile_body = body({"activate": True})
        ask = body({"question": QUESTION})
        ask_text = body({"question": QUESTION, "mode": "text"})

        lines = [
            "",
            self.style.SUCCESS("mnesio demo ready"),
            f"  operator login (admin, dashboard): {user.get_username()} / {password_note}",
            f"  API token: {token}",
            "",
            "Try it:",
            f"  curl {auth} {api}/memories/",
            f"  curl {auth} {new_memory} {api}/memories/",
            f"  curl {auth} {compile_body} {api}/cartridges/compile/",
            f"  curl {auth} {api}/cartridges/",
            f"  curl {auth} {ask} {api}/ask/",
            f"  curl {auth} {ask_text} {api}/ask/",
            f"  curl {auth} {base}/api/v1/kv/metrics",
            f"  curl {auth} {base}/metrics",
            "",
            f"Dashboard: {base}/dashboard/",
            f"Admin:     {base}/admin/",
            f"API docs:  {base}/api/docs/",
        ]
        self.stdout.write("\n".join(lines))

