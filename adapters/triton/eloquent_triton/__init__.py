"""Triton adapter: a streaming gateway in front of Triton and a helper for decoupled models.

Import the parts you need: ``eloquent_triton.gateway`` (needs starlette, httpx, tritonclient[grpc])
and ``eloquent_triton.decoupled`` (numpy only, loads inside Triton's Python-backend stub).
"""
