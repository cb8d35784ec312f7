"""nuPlan devkit adapter: run the LUNA stack (or a baseline) inside the devkit's ``run_simulation.py``.

* ``convert``: plain functions from the devkit's objects (read by attribute, duck-typed, so they are
  tested without the devkit) to ``luna_core.types`` and back to rear-axle trajectory samples;
* ``planner``: ``LunaNuPlanPlanner``, the devkit ``AbstractPlanner`` subclass (imports the devkit;
  nothing else in the project imports this module);
* ``scenario_filter``: writes a devkit scenario-filter YAML from a token list (Test14-Hard/Random);
* ``config/``: the hydra search-path root with ``planner/luna_planner.yaml`` (one planner) and
  ``planner/luna_stack_planner.yaml`` (the full stack: ``stack_planner.make_decision_source``).

See docs/nuplan.md for the commands.
"""
