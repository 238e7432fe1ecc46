// The order service's saga, tested against a running `holdfast --test-mode`:
//
//   holdfast --test-mode --database-url sqlite://./test-data/holdfast.db   # another terminal
//   npm ci && npm test
//
// Where it runs: HOLDFAST_ADDR (the coordinator, default 127.0.0.1:50051); the all-in-one's
// seats and payments participants are on the same IP, ports 50061 and 50064 (override with
// HOLDFAST_SEATS_ADDR, HOLDFAST_PAYMENTS_ADDR). Every test uses names of its own, so the tests
// can run again and again against one server. Expiry is reached by moving the server's clock
// (tcc.v1.Testing/AdvanceClock), never by sleeping.

import { strict as assert } from "node:assert";
import { randomUUID } from "node:crypto";
import { after, before, beforeEach, describe, test } from "node:test";
import * as grpc from "@grpc/grpc-js";

import { HOLD_FOR_SECONDS, OrderService, Reservation } from "./order-service";
import { call, client, reasonOf } from "./tcc";

const COORDINATOR = process.env.HOLDFAST_ADDR ?? "127.0.0.1:50051";
const HOST = COORDINATOR.slice(0, COORDINATOR.lastIndexOf(":"));
const SEATS = process.env.HOLDFAST_SEATS_ADDR ?? `${HOST}:50061`;
const PAYMENTS = process.env.HOLDFAST_PAYMENTS_ADDR ?? `${HOST}:50064`;
const PRICE = 4_200;

interface ResourceStatus {
  available: number;
  held: number;
  confirmed: number;
}

describe("an order saga against holdfast --test-mode", () => {
  const testing = client("Testing", COORDINATOR);
  const seats = client("ResourceAdmin", SEATS);
  const accounts = client("ResourceAdmin", PAYMENTS);
  let service: OrderService;
  let seat: string;
  let account: string;
  let customer: string;

  before(async () => {
    for (const [c, where] of [[testing, COORDINATOR], [seats, SEATS], [accounts, PAYMENTS]] as const) {
      await new Promise<void>((resolve, reject) =>
        c.waitForReady(Date.now() + 10_000, (e) =>
          e ? reject(new Error(`nothing answers at ${where}: is \`holdfast --test-mode\` running? (${e.message})`)) : resolve(),
        ),
      );
    }
  });

  beforeEach(async () => {
    const run = randomUUID().slice(0, 12);
    seat = `seat-${run}`;
    account = `card-${run}`;
    customer = `customer-${run}`;
    await call(seats, "PutResources", { resources: [{ resource: seat, capacity: 1 }] });
    await call(accounts, "PutResources", { resources: [{ resource: account, capacity: 100_000 }] });
    service?.close();
    service = new OrderService(COORDINATOR, PAYMENTS, `shop-${run}`);
  });

  after(() => {
    service?.close();
    for (const c of [testing, seats, accounts]) {
      c.close();
    }
  });

  const seatStatus = () => call<ResourceStatus>(seats, "GetResource", { resource: seat });

  test("a paid order is confirmed with its payment", async () => {
    const order = await service.place("order-1", customer, seat);
    assert.equal(order.status, "HELD");
    assert.ok(order.holdToken);
    assert.equal((await seatStatus()).held, 1);

    const confirmed = await service.pay("order-1", account, PRICE, "EUR");

    assert.equal(confirmed.state, "CONFIRMED");
    assert.equal(order.status, "PAID");
    assert.equal(confirmed.payments.length, 1);
    const [payment] = confirmed.payments;
    assert.deepEqual(
      [payment.participant, payment.payment_ref, payment.amount_minor, payment.currency, payment.state],
      ["payments", order.paymentRef, PRICE, "EUR", "APPLIED"],
    );
    const status = await seatStatus();
    assert.deepEqual([status.confirmed, status.held, status.available], [1, 0, 0]);
    // The feed says so too.
    await service.followEvents(() => order.status === "PAID");
  });

  test("an unpaid order expires and the feed tells the service", async () => {
    const order = await service.place("order-2", customer, seat);
    assert.equal(order.status, "HELD");
    service.cursor = await service.latestSequence();

    const moved = await call<{ expired: number }>(testing, "AdvanceClock", {
      by: { seconds: HOLD_FOR_SECONDS + 1 },
    });

    // The hold was released before AdvanceClock answered.
    assert.ok(moved.expired >= 1, `expired: ${moved.expired}`);
    const reservation = await call<Reservation>(service.holdfast, "GetReservation", {
      reservation_id: order.reservationId,
    });
    assert.equal(reservation.state, "EXPIRED");
    assert.equal((await seatStatus()).available, 1);
    // The service is told by the feed, not by polling the reservation.
    assert.equal(order.status, "HELD");
    await service.followEvents(() => order.status === "EXPIRED");
    assert.equal(order.status, "EXPIRED");
  });

  test("a confirm after expiry without payment is refused with HOLD_EXPIRED", async () => {
    const order = await service.place("order-3", customer, seat);
    await call(testing, "ExpireNow", { reservation_id: order.reservationId });
    const refused = await call(service.holdfast, "Confirm", {
      reservation_id: order.reservationId,
      hold_token: order.holdToken,
    }).then(
      () => assert.fail("a Confirm after expiry was accepted"),
      (e: grpc.ServiceError) => e,
    );
    assert.equal(refused.code, grpc.status.FAILED_PRECONDITION);
    assert.equal(reasonOf(refused), "HOLD_EXPIRED");
  });
});
