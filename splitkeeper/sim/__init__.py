"""The deterministic seeded fault simulator (``splitkeeper simulate``).

- :mod:`splitkeeper.sim.events`: scenarios, events and the seeded generator;
- :mod:`splitkeeper.sim.simulator`: :class:`Simulator` drives the protocol core
  through a scenario and checks the DESIGN 6 invariants after every step;
- :mod:`splitkeeper.sim.sink`: the simulated exactly-once sink;
- :mod:`splitkeeper.sim.shrink`: the shortest scenario that still breaks a rule;
- :mod:`splitkeeper.sim.broken`: deliberately broken components the simulator must catch;
- :mod:`splitkeeper.sim.command`: the CLI.

Imports only the protocol core: no Spark, Delta, Airflow or Great Expectations.
"""

from splitkeeper.sim.events import Scenario, generate_scenario
from splitkeeper.sim.simulator import (
    Components,
    Finding,
    ProgressOrder,
    SimCheck,
    SimConfig,
    SimulationResult,
    Simulator,
    run_scenario,
    simulate,
)

__all__ = [
    "Components",
    "Finding",
    "ProgressOrder",
    "Scenario",
    "SimCheck",
    "SimConfig",
    "SimulationResult",
    "Simulator",
    "generate_scenario",
    "run_scenario",
    "simulate",
]
