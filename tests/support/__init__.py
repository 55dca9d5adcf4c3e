"""What the test folders share (the fixtures themselves live in tests/conftest.py:
a fresh migrated database per test, its `settings`, `pool` and `store`; a folder
gives the store other settings by overriding `store_settings`).

  admission     admit through the store or the API (asserting it was admitted)
  waiting       wait for an observable event, never a fixed sleep: wait_until,
                wait_until_sync, wait_status, wait_event
  history       an execution's events, steps and signals
  clocks        move database time by UPDATE-ing rows; take over a live lease
  responses     the API's error shape, raw bodies, a record
  asgi          the API in-process (httpx over ASGITransport)
  live_server   the API on a real socket, from a thread
  api_process   a real `fencepost api` process
  processes     real `fencepost worker` processes (signals, logs, exits)
  workers       in-process workers (asyncio tasks), and their claim rounds
  races         race tests that prove which interleavings happened
  timing        short lease/poll timings for tests with workers
"""
