"""The REST admin API: routes, schemas, the OpenAPI document and handlers."""
