"""Grafana's dashboards as code (`build`, with Grafana's own SDK, into deploy/grafana/dashboards), the PromQL they
share with the run report's rules (`queries`), and `streamtrain dashboards render`, which draws them as PNGs from
a plain Prometheus where no Grafana runs (`render`)."""
