"""Concurrent creations of one scope name over the API, on PostgreSQL: one 201, the others 409 naming `name`.

Four threads (four database connections) are all held after the name check and before the insert (a pre_save
hook waits at a barrier), so every request passes the check and the unique index decides: the race is forced
every run, not left to timing.
"""
from __future__ import annotations

import threading

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

NUM_THREADS = 4


def test_it_answers_409_to_the_losers_of_a_race_for_one_scope_name(api_client_for, record_figures):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.db import connection
    from django.db.models.signals import pre_save

    from memories.models import Scope

    staff = get_user_model().objects.create_user(username="sam", password="x", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(content_type__app_label="memories", codename="add_scope"))
    clients = [api_client_for(staff) for _ in range(NUM_THREADS)]
    barrier = threading.Barrier(NUM_THREADS, timeout=30)

    def held_before_insert(sender, instance, **kwargs) -> None:
        barrier.wait()  # every request has passed the name check: all of them insert

    responses: list = [None] * NUM_THREADS

    def create(i: int) -> None:
        try:
            responses[i] = clients[i].post("/api/v1/scopes/", data={"name": "contested"}, format="json")
        finally:
            connection.close()  # this thread's own connection

    pre_save.connect(held_before_insert, sender=Scope, dispatch_uid="scope-race-barrier")
    try:
        for client in clients:
            client.raise_request_exception = False  # a 500 is an answer to count, not an exception in the thread
        threads = [threading.Thread(target=create, args=(i,)) for i in range(NUM_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        pre_save.disconnect(dispatch_uid="scope-race-barrier", sender=Scope)
    statuses = sorted(r.status_code for r in responses)
    record_figures(scenario="concurrent scope creation", num_threads=NUM_THREADS, statuses=statuses)
    assert statuses == [201] + [409] * (NUM_THREADS - 1), [(r.status_code, r.content[:200]) for r in responses]
    for response in responses:
        if response.status_code == 409:
            assert response.json()["code"] == "conflict" and response.json()["extra"]["field"] == "name"
    assert Scope.objects.filter(name="contested").count() == 1
