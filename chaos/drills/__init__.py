"""The drills: scenarios, their runner, observation, measurement, reports, the schedule and
the drill service. They act on a deployment through a DrillTarget and never import the lab."""
