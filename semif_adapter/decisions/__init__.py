"""The decision API: ``/invocations`` with SageMaker's ``/ping``, ``/metrics``; routes and error shape."""
