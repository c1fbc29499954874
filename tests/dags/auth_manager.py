"""An auth manager for the plugin test: Airflow's Simple auth manager (its users, roles, token
endpoint and JWTs), except that the user ``outsider`` may not read the DAG named by
``$SPLITKEEPER_TEST_HIDDEN_DAG`` (nor "every DAG"): a per-DAG denial, which the Simple auth
manager's roles cannot express. The API server loads it from ``AIRFLOW__CORE__AUTH_MANAGER``."""

from __future__ import annotations

import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

HIDDEN_DAG_ENV = "SPLITKEEPER_TEST_HIDDEN_DAG"
OUTSIDER = "outsider"


class OneDagHiddenAuthManager(SimpleAuthManager):
    def is_authorized_dag(
        self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None
    ) -> bool:
        dag_id = None if details is None else details.id
        if user.get_name() == OUTSIDER and dag_id in (None, os.environ.get(HIDDEN_DAG_ENV)):
            return False
        return super().is_authorized_dag(
            method=method, user=user, access_entity=access_entity, details=details
        )
