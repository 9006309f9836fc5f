-- wrk script for the trigger workloads (bench/workloads/http.py runs it).
--
--   BENCH_WRK_QUANTILES=FILE wrk ... -s bench/wrk/trigger.lua URL -- MODE TOKEN PREFIX REPLAY_KEYS
--
-- MODE    new      POST /api/v1/tasks, a new Idempotency-Key every request
--         replay   POST /api/v1/tasks, one of REPLAY_KEYS keys created beforehand
--                  (replay-0 .. replay-(N-1), same workflow and payload)
--         mixed    alternately new and replay
--         ceiling  POST /bench/ceiling (the bare insert), a new key every request
-- Keys are PREFIX-<thread>-<counter>: unique within a run; PREFIX differs per run.
-- At the end the latency quantiles 0.1 %, 0.2 %, ... 100 % (microseconds) go to
-- FILE, one a line, so the Python side can merge several runs' distributions
-- (an environment variable: done() runs in the main Lua state, where init()
-- never ran).

local thread_count = 0

function setup(thread)
  thread_count = thread_count + 1
  thread:set("tid", thread_count)
end

function init(args)
  mode, token, prefix = args[1], args[2], args[3]
  replay_keys = tonumber(args[4])
  counter = 0
  headers = {["Authorization"] = "Token " .. token,
             ["Content-Type"] = "application/json"}
  body = '{"workflow": "test.noop3", "payload": {"n": 1}}'
end

local function post(path, key, payload)
  headers["Idempotency-Key"] = key
  return wrk.format("POST", path, headers, payload)
end

local function new_key()
  return prefix .. "-" .. tid .. "-" .. counter
end

local function replay_key()
  -- threads start at different keys so they rarely lock the same row at once
  return "replay-" .. ((counter * 7 + tid * 131) % replay_keys)
end

function request()
  counter = counter + 1
  if mode == "new" then
    return post("/api/v1/tasks", new_key(), body)
  elseif mode == "replay" then
    return post("/api/v1/tasks", replay_key(), body)
  elseif mode == "mixed" then
    if counter % 2 == 0 then
      return post("/api/v1/tasks", new_key(), body)
    end
    return post("/api/v1/tasks", replay_key(), body)
  elseif mode == "ceiling" then
    return post("/bench/ceiling", new_key(), body)
  end
  error("unknown mode " .. tostring(mode))
end

function done(summary, latency, requests)
  local f = assert(io.open(os.getenv("BENCH_WRK_QUANTILES"), "w"))
  for i = 1, 1000 do
    f:write(latency:percentile(i / 10), "\n")
  end
  f:close()
  local e = summary.errors
  io.write(string.format(
    'BENCH-WRK {"requests": %d, "duration_us": %d, "non_2xx": %d, "socket_errors": %d}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout))
end
