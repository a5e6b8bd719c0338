-- The flash-sale benchmark's script for wrk (bench/flash-sale/wrk.ts runs it):
--   wrk ... -s bench/wrk/load.lua <url> -- <method> <path> <lines file or ""> <authorization or ""> <threads> <accept-encoding>
-- With a lines file (one "<authorization>\t<idempotency key>" per line, pre-signed: Lua has no
-- HMAC), each request is a grab by the next user of this thread's share of the lines; without one,
-- the same request every time. Answers are counted by class (SUCCESS, SOLD_OUT, HTTP_<status>) and
-- printed by done() as one line: WRK_RESULT {json}.
local threads = {}

function setup(thread)
  thread:set("index", #threads)
  table.insert(threads, thread)
end

function init(args)
  local method, path, file, auth, nthreads, encodings = args[1], args[2], args[3], args[4], tonumber(args[5]), args[6]
  classes = {}
  wrapped = false
  users = {}
  pos = 0
  if file ~= "" then
    local n = 0
    for line in io.lines(file) do
      if n % nthreads == index then
        local tab = string.find(line, "\t", 1, true)
        local headers = { ["Authorization"] = string.sub(line, 1, tab - 1), ["Idempotency-Key"] = string.sub(line, tab + 1), ["Content-Length"] = "0" }
        table.insert(users, wrk.format(method, path, headers))
      end
      n = n + 1
    end
  else
    local headers = {}
    if auth ~= "" then headers["Authorization"] = auth end
    -- A read asks for gzip as the Node generator's does (a browser's header).
    if method == "GET" then headers["Accept-Encoding"] = encodings end
    if method == "POST" then headers["Content-Length"] = "0" end
    fixed = wrk.format(method, path, headers)
  end
end

function request()
  if fixed then return fixed end
  pos = pos + 1
  -- Past the last user the keys repeat (replays): the runner reports that as a violation.
  if pos > #users then wrapped = true end
  return users[(pos - 1) % #users + 1]
end

function response(status, headers, body)
  local c
  if status >= 200 and status < 300 then
    c = "SUCCESS"
  elseif status == 409 and body and string.find(body, '"SOLD_OUT"', 1, true) then
    c = "SOLD_OUT"
  else
    c = "HTTP_" .. status
  end
  classes[c] = (classes[c] or 0) + 1
end

function done(summary, latency, requests)
  local total, anyWrapped = {}, false
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("classes")) do total[k] = (total[k] or 0) + v end
    if t:get("wrapped") then anyWrapped = true end
  end
  local parts = {}
  for k, v in pairs(total) do table.insert(parts, string.format('"%s":%d', k, v)) end
  local e = summary.errors
  io.write(string.format(
    'WRK_RESULT {"requests":%d,"durationUs":%d,"errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d},' ..
      '"latencyUs":{"p50":%d,"p90":%d,"p99":%d,"max":%d},"classes":{%s},"wrapped":%s}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    table.concat(parts, ","), tostring(anyWrapped)))
end
