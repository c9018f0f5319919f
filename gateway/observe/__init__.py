"""What the gateway tells operators: Prometheus metrics, the JSON access log and OpenTelemetry
tracing, from one record of each inference request."""
