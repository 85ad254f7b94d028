"""What mlatrace shows of a trace: the report (text, --json, HTML), diff, check's verdict,
whatif, the watch view and the exports (Perfetto, OTLP), with the table and chart helpers
they share.

The layers below (record, probe, trace, analysis, settings, kinds) never import this
package; only the entry points do (cli.py, the pytest plugin, bench, the reference demo,
and the bootstrap for `run --otlp`'s live export).
"""
