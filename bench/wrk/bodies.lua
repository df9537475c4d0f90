-- wrk script: POST pre-built bodies in a loop, each thread from its own random start.
-- BODIES names a file of bodies, each preceded by its length (4 bytes, big-endian);
-- CONTENT_TYPE is their media type (default application/msgpack).
local bodies = {}
local counter = 0
local content_type = os.getenv("CONTENT_TYPE") or "application/msgpack"

function init(args)
  local f = assert(io.open(assert(os.getenv("BODIES"), "BODIES not set"), "rb"))
  local data = f:read("*all")
  f:close()
  local pos = 1
  while pos <= #data do
    local b1, b2, b3, b4 = data:byte(pos, pos + 3)
    local n = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
    bodies[#bodies + 1] = data:sub(pos + 4, pos + 3 + n)
    pos = pos + 4 + n
  end
  math.randomseed(os.time() + #bodies)
  counter = math.random(#bodies)
end

function request()
  counter = counter % #bodies + 1
  return wrk.format("POST", nil, {["Content-Type"] = content_type}, bodies[counter])
end
