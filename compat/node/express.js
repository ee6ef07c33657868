// An orders endpoint behind express-idempotency, configured as its README
// shows. Environment: PORT, DELAY_MS (how long creating an order takes,
// 100 by default), FAIL_MODE (how a request with X-Fail fails: "next", the
// default, passes an error to Express's own error handler; "respond"
// answers 500 itself).
'use strict';

const express = require('express');
const { idempotency, getSharedIdempotencyService } = require('express-idempotency');

const port = Number(process.env.PORT || 3000);
const delay = Number(process.env.DELAY_MS ?? 100);
const failMode = process.env.FAIL_MODE || 'next';

const app = express();
app.use(express.json());
app.post('*', idempotency());

let created = 0;
app.post('/orders', async (req, res, next) => {
  // The middleware calls next() after it replays: the handler must check.
  if (getSharedIdempotencyService().isHit(req)) {
    return;
  }
  if (req.get('X-Fail')) {
    // As the library's README asks: a failed request's key is released.
    getSharedIdempotencyService().reportError(req);
    if (failMode === 'respond') {
      res.status(500).json({ error: 'induced failure' });
      return;
    }
    next(new Error('induced failure'));
    return;
  }
  await new Promise((resolve) => setTimeout(resolve, delay));
  const id = ++created;
  res.status(201).location(`/orders/${id}`).json({ id, order: req.body });
});

app.listen(port, '127.0.0.1');
