"""The order service's saga, tested against a running `holdfast --test-mode`.

    holdfast --test-mode --database-url sqlite://./test-data/holdfast.db   # another terminal
    python3 test_saga.py

Where it runs: HOLDFAST_ADDR (the coordinator, default 127.0.0.1:50051); the all-in-one's
seats and payments participants are on the same IP, ports 50061 and 50064 (override with
HOLDFAST_SEATS_ADDR, HOLDFAST_PAYMENTS_ADDR). Every test uses names of its own, so the tests
can run again and again against one server. Expiry is reached by moving the server's clock
(tcc.v1.Testing/AdvanceClock), never by sleeping.
"""

import os
import unittest
import uuid

import grpc
from google.protobuf import duration_pb2

from order_service import HOLD_FOR_SECONDS, OrderService, reason_of
from tcc_stubs import (
    coordinator_pb2,
    resource_admin_pb2,
    resource_admin_pb2_grpc,
    testing_pb2,
    testing_pb2_grpc,
)

Reservation = coordinator_pb2.Reservation
PaymentState = coordinator_pb2.Reservation.PaymentRecord

COORDINATOR = os.environ.get("HOLDFAST_ADDR", "127.0.0.1:50051")
HOST = COORDINATOR.rsplit(":", 1)[0]
SEATS = os.environ.get("HOLDFAST_SEATS_ADDR", f"{HOST}:50061")
PAYMENTS = os.environ.get("HOLDFAST_PAYMENTS_ADDR", f"{HOST}:50064")
PRICE = 4_200


class OrderSaga(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.coordinator = grpc.insecure_channel(COORDINATOR)
        cls.payments = grpc.insecure_channel(PAYMENTS)
        cls.seats = grpc.insecure_channel(SEATS)
        for channel, where in [(cls.coordinator, COORDINATOR), (cls.payments, PAYMENTS), (cls.seats, SEATS)]:
            try:
                grpc.channel_ready_future(channel).result(timeout=10)
            except grpc.FutureTimeoutError:
                raise RuntimeError(f"nothing answers at {where}: is `holdfast --test-mode` running?")
        cls.testing = testing_pb2_grpc.TestingStub(cls.coordinator)
        cls.resources = resource_admin_pb2_grpc.ResourceAdminStub(cls.seats)
        cls.payment_accounts = resource_admin_pb2_grpc.ResourceAdminStub(cls.payments)

    @classmethod
    def tearDownClass(cls):
        for channel in (cls.coordinator, cls.payments, cls.seats):
            channel.close()

    def setUp(self):
        run = uuid.uuid4().hex[:12]
        self.seat = f"seat-{run}"
        self.account = f"card-{run}"
        self.customer = f"customer-{run}"
        self.resources.PutResources(
            resource_admin_pb2.PutResourcesRequest(
                resources=[resource_admin_pb2.ResourceSpec(resource=self.seat, capacity=1)]
            )
        )
        self.payment_accounts.PutResources(
            resource_admin_pb2.PutResourcesRequest(
                resources=[resource_admin_pb2.ResourceSpec(resource=self.account, capacity=100_000)]
            )
        )
        self.service = OrderService(self.coordinator, self.payments, shop=f"shop-{run}")

    def seat_status(self):
        return self.resources.GetResource(resource_admin_pb2.GetResourceRequest(resource=self.seat))

    def test_a_paid_order_is_confirmed_with_its_payment(self):
        order = self.service.place("order-1", self.customer, self.seat)
        self.assertEqual(order.status, "HELD")
        self.assertTrue(order.hold_token)
        self.assertEqual(self.seat_status().held, 1)

        confirmed = self.service.pay("order-1", self.account, PRICE, "EUR")

        self.assertEqual(confirmed.state, Reservation.CONFIRMED)
        self.assertEqual(order.status, "PAID")
        [payment] = confirmed.payments
        self.assertEqual(payment.participant, "payments")
        self.assertEqual(payment.payment_ref, order.payment_ref)
        self.assertEqual((payment.amount_minor, payment.currency), (PRICE, "EUR"))
        self.assertEqual(payment.state, PaymentState.APPLIED)
        seat = self.seat_status()
        self.assertEqual((seat.confirmed, seat.held, seat.available), (1, 0, 0))
        # The feed says so too.
        self.service.follow_events(done=lambda: order.status == "PAID")

    def test_an_unpaid_order_expires_and_the_feed_tells_the_service(self):
        order = self.service.place("order-2", self.customer, self.seat)
        self.assertEqual(order.status, "HELD")
        self.service.cursor = self.service.latest_sequence()

        moved = self.testing.AdvanceClock(
            testing_pb2.AdvanceClockRequest(by=duration_pb2.Duration(seconds=HOLD_FOR_SECONDS + 1))
        )

        # The hold was released before AdvanceClock answered.
        self.assertGreaterEqual(moved.expired, 1)
        reservation = self.service.holdfast.GetReservation(
            coordinator_pb2.GetReservationRequest(reservation_id=order.reservation_id)
        )
        self.assertEqual(reservation.state, Reservation.EXPIRED)
        self.assertEqual(self.seat_status().available, 1)
        # The service was told by the feed, not by polling the reservation.
        self.assertEqual(order.status, "HELD")
        self.service.follow_events(done=lambda: order.status == "EXPIRED")
        self.assertEqual(order.status, "EXPIRED")

    def test_a_confirm_after_expiry_without_payment_is_refused(self):
        order = self.service.place("order-3", self.customer, self.seat)
        self.testing.ExpireNow(testing_pb2.ExpireNowRequest(reservation_id=order.reservation_id))
        with self.assertRaises(grpc.RpcError) as refused:
            self.service.holdfast.Confirm(
                coordinator_pb2.ConfirmRequest(
                    reservation_id=order.reservation_id, hold_token=order.hold_token
                )
            )
        self.assertEqual(refused.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(reason_of(refused.exception), "HOLD_EXPIRED")


if __name__ == "__main__":
    unittest.main(verbosity=2)
