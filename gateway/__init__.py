"""An OpenAI-compatible HTTP gateway in front of one or more modelds (FastAPI + uvicorn)."""
