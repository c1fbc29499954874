"""The deterministic seeded fault simulator (``splitkeeper simulate``).

- :mod:`splitkeeper.sim.events`: scenarios, events and the seeded generator;
- :mod:`splitkeeper.sim.simulator`: :class:`Simulator` runs the epoch driver
  (:mod:`splitkeeper.core.driver`) with in-memory adapters through a scenario and
  checks the invariants of protocol section 6 after every step;
- :mod:`splitkeeper.sim.sink`: the simulated exactly-once sink;
- :mod:`splitkeeper.sim.shrink`: the shortest scenario that still breaks a rule;
- :mod:`splitkeeper.sim.broken`: deliberately broken components (and a broken driver) the
  simulator must catch;
- :mod:`splitkeeper.sim.command`: the CLI.

Imports only the protocol core: no Spark, Delta, Airflow or Great Expectations.
"""

from splitkeeper.sim.events import Scenario, generate_scenario
from splitkeeper.sim.shrink import simulate
from splitkeeper.sim.simulator import (
    Components,
    Finding,
    SimCheck,
    SimConfig,
    SimulationResult,
    Simulator,
    run_scenario,
)

__all__ = [
    "Components",
    "Finding",
    "Scenario",
    "SimCheck",
    "SimConfig",
    "SimulationResult",
    "Simulator",
    "generate_scenario",
    "run_scenario",
    "simulate",
]
