"""The ASGI application. FastAPI: request validation and the OpenAPI document come
from the same pydantic models, and it has native SSE for the activity stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import grpc
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp

from gateway_http import errors, openapi
from gateway_http.activity import ActivityFanout
from gateway_http.backends import Backends
from gateway_http.hot_routes import HotRoutes
from gateway_http.middleware import RequestContextMiddleware
from gateway_http.routes import (
    channels,
    conversation,
    crons,
    dashboard,
    dispatch,
    health,
    me,
    questions,
    sessions,
    targets,
    tasks,
)
from gateway_http.store import GatewayStore
from gateway_http.task_stream import TaskStreams
from gateway_http.telegram import TelegramAdapter
from libs.settings import Settings


class GatewayApp(FastAPI):
    def build_middleware_stack(self) -> ASGIApp:
        # Outside everything FastAPI adds (its body-size limit included), so every
        # answer carries the request id and every error the {error, message} shape.
        # The hot task routes inside it: request ids, logs and metrics stay the same for them.
        return RequestContextMiddleware(HotRoutes(super().build_middleware_stack(), self), self.max_body_size)


def telegram_adapters(settings: Settings, store: GatewayStore, backends: Backends) -> dict[str, TelegramAdapter]:
    def runner(agent_id: str, session_id: str, principal: str, text: str) -> Awaitable[dict[str, Any]]:
        return questions.run_command(backends, (), agent_id, session_id, principal, text)

    return {
        name: TelegramAdapter(name, channel, store, backends, runner)
        for name, channel in settings.channels.items()
        if channel.kind == "telegram"
    }


def create_app(settings: Settings, store: GatewayStore) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # grpc.aio channels belong to the serving event loop.
        app.state.backends = Backends.open(settings)
        app.state.activity = ActivityFanout(app.state.backends.notifier, conversation.notification_json)
        app.state.task_streams = TaskStreams(app.state.backends.scheduler, settings.notifier.sse_client_buffer)
        app.state.telegram = telegram_adapters(settings, store, app.state.backends)
        bots = [asyncio.create_task(a.run(), name=f"telegram-{n}") for n, a in app.state.telegram.items()]
        try:
            yield
        finally:
            for bot in bots:
                bot.cancel()
            await asyncio.gather(*bots, return_exceptions=True)
            await app.state.activity.close()
            await app.state.task_streams.close()
            await app.state.backends.close()

    app = GatewayApp(
        title="taskgate",
        version="0.1.0",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
        # FastAPI's own limit: counts the bytes of chunked bodies too, not only Content-Length.
        max_body_size=settings.max_body_bytes,
        # One schema per model: optional response fields are omitted, not required-and-null.
        separate_input_output_schemas=False,
        # The gateway's metrics are Prometheus (/metrics) and nothing here sets up OpenTelemetry,
        # yet FastAPI's native hooks asked for OTel's tracer, meter and logger providers on every
        # request (6.4 µs each in a loop here; 2.8 % of the gateway's samples in the throughput run).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.store = store
    app.state.telegram = {}
    app.state.ui_assets = dashboard.load_assets()
    app.add_exception_handler(errors.ApiError, errors.api_error_handler)
    app.add_exception_handler(grpc.aio.AioRpcError, errors.rpc_error_handler)
    app.add_exception_handler(RequestValidationError, errors.validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, errors.http_error_handler)
    app.add_exception_handler(Exception, errors.unhandled_error_handler)
    app.include_router(health.router)
    app.include_router(tasks.router)
    app.include_router(sessions.router)
    app.include_router(conversation.router)
    app.include_router(questions.router)
    app.include_router(channels.router)
    app.include_router(me.router)
    app.include_router(dashboard.router)
    app.include_router(crons.router)
    app.include_router(dispatch.router)
    app.include_router(targets.router)
    openapi.install(app, settings)
    return app
