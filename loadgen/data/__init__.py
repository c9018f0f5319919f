"""Data shipped with the load generator: a small synthetic trace in the Azure Functions 2019
format and the script that makes it."""
