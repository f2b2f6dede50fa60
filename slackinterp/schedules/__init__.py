"""Recurring analyses: a thread re-runs on a schedule and posts its results.

`phrases` (what people type → a rule), `timing` (a rule's next run in the owner's time zone),
`runner` (one scheduled run: a turn of the engine in a fresh kernel), `report` (its events
folded into what the reply shows), `service` (APScheduler jobs built from the
stored schedules, claims so each occurrence runs once across replicas, failures, missed runs),
`ports` (what the service needs from a front-end). Nothing here imports Slack:
slack/schedule_front.py renders it.
"""
